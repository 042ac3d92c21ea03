#!/usr/bin/env bash
# The README's main-job demo, one command: builds `fenced`, boots the hwtests guest
# (kernel nvmet target, one reservation-capable namespace with the target's default
# identifiers, a UUID only, three loop hosts) and runs
# fenced/scenarios/guest-fence.sh in it with etcd and three fenced daemons (a fourth
# joins for the last phase, a device that refuses every preempt).
#
# --tls (or FENCED_DEMO_TLS=1): the same demo against a locked-down etcd. A CA, the
# server's certificate and one client certificate per etcd user (root, ops, n1..n4:
# the CN is the user) are generated here with openssl; in the guest etcd serves
# https:// only, with --client-cert-auth and auth enabled, and every daemon and
# command authenticates with its own certificate under the roles of
# `fenced etcd-roles`. Other arguments go to hwtests/guest/run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tls=${FENCED_DEMO_TLS:-0}
args=()
for a in "$@"; do
  case $a in
    --tls) tls=1 ;;
    *) args+=("$a") ;;
  esac
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/fenced-target}
command -v etcd >/dev/null || apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 etcd-server
(cd "$repo" && cargo build -p fenced --bin fenced)
stage=${HWTEST_GUEST_CACHE:-/var/tmp/fenced-guest-cache}/fenced-demo
mkdir -p "$stage"
cp "$CARGO_TARGET_DIR/debug/fenced" "$stage/fenced"
strip "$stage/fenced" 2>/dev/null || true
extra=()
if [[ $tls == 1 ]]; then
  command -v etcdctl >/dev/null || apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 etcd-client
  command -v openssl >/dev/null || apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 openssl
  pki=$stage/tls
  rm -rf "$pki"
  mkdir -p "$pki"
  # ECDSA P-256 keys (PKCS#8), valid two days: fresh for every run. The server's
  # certificate is also a client's: etcd's gateway dials etcd with it.
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=fenced demo CA" -keyout "$pki/ca-key.pem" -out "$pki/ca.pem" 2>/dev/null
  # issue NAME CN EXTENSIONS: a certificate for CN signed by the CA.
  issue() {
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
      -keyout "$pki/$1-key.pem" -out "$pki/$1.csr" 2>/dev/null
    openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca-key.pem" \
      -CAcreateserial -days 2 -extfile <(printf '%b' "$3") -out "$pki/$1.pem" 2>/dev/null
    rm "$pki/$1.csr"
  }
  issue server etcd 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth'
  for user in root ops n1 n2 n3 n4; do
    issue "$user" "$user" 'extendedKeyUsage=clientAuth'
  done
  rm -f "$pki/ca-key.pem" "$pki/ca.srl"
  echo "run-guest-demo: TLS: certificates in $pki (CA, server, clients root ops n1..n4)"
  # Every connection pays a handshake in the emulated guest: allow it more time.
  export HWTEST_GUEST_TIMEOUT=${HWTEST_GUEST_TIMEOUT:-900}
  extra=(--add "$pki=/etc/fenced-demo-tls" --env FENCED_DEMO_TLS_DIR=/etc/fenced-demo-tls
    --add "$(command -v etcdctl)=/usr/local/bin/etcdctl")
fi
# The namespaces keep the kernel target's default identifiers (a random UUID, no NGUID),
# as a user's nvmet target does (issue 27); --ns-ids nguid or serial after it overrides.
exec "$repo/hwtests/guest/run" --scenario "$here/guest-fence.sh" --ns-ids default \
  --add "$(command -v etcd)=/usr/local/bin/etcd" --add "$stage/fenced=/usr/local/bin/fenced" \
  "${extra[@]}" "${args[@]}"
