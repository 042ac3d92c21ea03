#!/usr/bin/env bash
# Issue 14 section 2's guest test, one command: builds `fenced` and `nvme-resv`, boots
# the hwtests guest with two reservation-capable namespaces (--resv-namespaces 2) and
# runs fenced/scenarios/guest-namespace.sh in it with etcd and etcdctl.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/fenced-target}
command -v etcd >/dev/null && command -v etcdctl >/dev/null \
  || apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 etcd-server etcd-client
(cd "$repo" && cargo build -p fenced --bin fenced -p nvme-resv --bin nvme-resv)
stage=${HWTEST_GUEST_CACHE:-/var/tmp/fenced-guest-cache}/fenced-namespace
mkdir -p "$stage"
for b in fenced nvme-resv; do
  cp "$CARGO_TARGET_DIR/debug/$b" "$stage/$b"
  strip "$stage/$b" 2>/dev/null || true
done
exec "$repo/hwtests/guest/run" --scenario "$here/guest-namespace.sh" --resv-namespaces 2 --no-cli \
  --add "$(command -v etcd)=/usr/local/bin/etcd" --add "$(command -v etcdctl)=/usr/local/bin/etcdctl" \
  --add "$stage/fenced=/usr/local/bin/fenced" --add "$stage/nvme-resv=/usr/local/bin/nvme-resv" "$@"
