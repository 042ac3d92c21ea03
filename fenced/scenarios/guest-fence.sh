#!/bin/sh
# The main-job demo, inside the hwtests guest (busybox sh): etcd + three `fenced`
# daemons on the three loop hosts of one reservation-capable namespace.
#   1. all three join, register their keys, one holds Write Exclusive - Registrants Only
#   2. SIGSTOP n3 until its lease expires: the survivors preempt its key, verify, bump
#   3. SIGCONT n3: a write from its host fails with ReservationConflict, a metadata
#      transaction guarded by its old generation is refused, and the daemon self-fences
#      (exit 3) without re-registering its key
#   4. `fenced leave` on n1: departs cleanly, is not fenced
#   5. a device that refuses every preempt: n4 joins on host A and is SIGKILLed while
#      the only controller left (n2) fences through host B, whose registration was moved
#      to host C (same key, so n2's agent still finds its key and keeps running). Every
#      preempt from host B gets Reservation Conflict from nvmet: the fence stays owed,
#      never bumps, and each sweep logs the retry. Host B registered again, the next
#      sweep completes the fence exactly once.
# With FENCED_DEMO_TLS_DIR (run-guest-demo.sh --tls), the same against a locked-down
# etcd: https:// only, --client-cert-auth, auth enabled, the roles of `fenced
# etcd-roles`; each daemon authenticates as its node (certificate CN n1..n4, its node
# role plus the controller role), the commands below as "ops" (the operator role, and
# writes under probe/ for the application's guarded write).
# Run from the host with fenced/scenarios/run-guest-demo.sh. Prints a timeline.
set -u
A=${HWTEST_NVME_HOSTS%%,*}; rest=${HWTEST_NVME_HOSTS#*,}; B=${rest%%,*}; C=${rest#*,}
T=${FENCED_DEMO_TLS_DIR:-}
EP=http://127.0.0.1:2379
[ -n "$T" ] && EP=https://127.0.0.1:2379
ROOT=/demo
# Lease TTLs: TLS in the TCG guest (a debug build, an emulated CPU) makes each
# keepalive slower; doubled so that no lease expires under load alone.
TTL=5; TTL4=3
[ -n "$T" ] && TTL=10 && TTL4=6
# A command waits 5 s for etcd by default: the emulated guest on a loaded host (and a
# TLS handshake more so) can take longer to answer.
export FENCED_CONNECT_TIMEOUT_SECS=30
# sec USER: the etcd TLS flags of USER's certificate (nothing in plaintext).
sec() { if [ -n "$T" ]; then echo "--etcd-ca $T/ca.pem --etcd-cert $T/$1.pem --etcd-key $T/$1-key.pem"; fi; }
# The operator commands' etcd flags.
E="--etcd-endpoints $EP --root $ROOT $(sec ops)"
# etcdctl as etcd's root (TLS only).
ctl() { etcdctl --endpoints $EP --cacert "$T/ca.pem" --cert "$T/root.pem" --key "$T/root-key.pem" "$@"; }
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "demo[$(t)s]: $*"; }
die() { say "FAIL: $*"; for f in /tmp/n1.log /tmp/n2.log /tmp/n3.log /tmp/n4.log /tmp/etcd.log; do echo "--- $f"; tail -n 30 "$f"; done; exit 1; }
# until_ SECONDS WHAT CMD...: poll CMD every 0.5 s for at most SECONDS.
until_() {
  lim=$1; what=$2; shift 2; start=$(t)
  until "$@"; do
    awk "BEGIN{exit !($(t) - $start > $lim)}" && die "timed out after ${lim}s waiting for $what"
    sleep 0.5
  done
}
# `fenced status` rows: NODE MEMBER GEN first (no spaces in them), after a summary and a header line.
row_of() { fenced status $E | awk -v n="$1" 'NR > 2 && $1 == n'; }
gen_of() { row_of "$1" | awk '{print $3}'; }
members() { fenced status $E | awk 'NR > 2 && $2 == "yes" {printf "%s ", $1}'; }
report() { nvme resv-report "$1" --eds 2>/dev/null || nvme-resv report "$1" 2>/dev/null; }
key_of() { nvme-resv key-for-node "$1" 2>/dev/null; }

say "hosts: A=$A B=$B C=$C"
mkdir -p /tmp/etcd
ETCD_TLS=
[ -n "$T" ] && ETCD_TLS="--cert-file $T/server.pem --key-file $T/server-key.pem --trusted-ca-file $T/ca.pem --client-cert-auth"
etcd --name g1 --data-dir /tmp/etcd/data --listen-client-urls $EP --advertise-client-urls $EP \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster g1=http://127.0.0.1:2380 $ETCD_TLS >/tmp/etcd.log 2>&1 &
ETCD=$!
if [ -n "$T" ]; then
  healthy() { ctl endpoint health >/dev/null 2>&1; }
else
  healthy() { wget -qO- $EP/health 2>/dev/null | grep -q true; }
fi
until_ 60 "etcd health" healthy
say "etcd healthy (pid $ETCD)"
if [ -n "$T" ]; then
  # Users are certificate CNs (no passwords). The roles: `fenced etcd-roles`, applied
  # as root; each node also runs a controller (role both); ops may write the
  # application's keys under probe/.
  ctl user add root --no-password >/dev/null && ctl role add root >/dev/null \
    && ctl user grant-role root root >/dev/null || die "creating etcd's root user failed"
  fenced etcd-roles --etcd-endpoints $EP --root $ROOT $(sec root) --nodes n1,n2,n3,n4 \
    --arenas a1,a2,a3 --apply >/tmp/roles.log 2>&1 || { cat /tmp/roles.log; die "fenced etcd-roles --apply failed"; }
  tail -n 1 /tmp/roles.log
  for u in n1 n2 n3 n4; do ctl user grant-role $u fenced-controller >/dev/null || die "granting $u the controller role failed"; done
  ctl user add ops --no-password >/dev/null && ctl user grant-role ops fenced-operator >/dev/null \
    && ctl role add demo-app >/dev/null && ctl role grant-permission demo-app --prefix readwrite $ROOT/probe/ >/dev/null \
    && ctl user grant-role ops demo-app >/dev/null || die "creating the ops user failed"
  ctl auth enable >/dev/null || die "enabling etcd auth failed"
  say "etcd: TLS only ($EP), --client-cert-auth, auth enabled; users root, ops, n1..n4 by certificate CN"
  # A client that presents no certificate is refused: one line, no retry.
  NOCERT="--etcd-endpoints $EP --root $ROOT --etcd-ca $T/ca.pem"
  fenced status $NOCERT >/tmp/nocert.log 2>&1 && die "etcd served a client without a certificate"
  say "without a client certificate: $(tail -n 1 /tmp/nocert.log)"
fi

# What the namespace reports and which identity fenced will record (hwtests/guest/run
# --ns-ids: run-guest-demo.sh serves the kernel target's defaults, a UUID only).
IDS=${HWTEST_NS_IDS:-nguid}
say "namespace identifiers: $IDS"
command -v nvme-resv >/dev/null && nvme-resv capabilities "$A" | grep -E 'identity|fenced records|wwid|descriptor|controller'
n=1
for dev in $A $B $C; do
  fenced run --node-id n$n --instance-id guest-n$n --block-device "$dev" --fencer nvme \
    --etcd-endpoints $EP --root $ROOT $(sec n$n) --ttl-secs $TTL --sweep-secs 3 --claim-ttl-secs 30 \
    --seed-arenas a1,a2,a3 --arenas 1 --pid-file /tmp/n$n.pid >/tmp/n$n.log 2>&1 &
  eval "PID$n=$!"
  n=$((n + 1))
done
three() { [ "$(members | wc -w)" = 3 ]; }
until_ 120 "three members" three
say "three members: $(members)"
fenced status $E
NSLINE=$(fenced status $E | grep '^namespace:')
case $IDS in
  default) echo "$NSLINE" | grep -q '^namespace: UUID ' || die "the UUID-only namespace is not recorded by its UUID: $NSLINE" ;;
  serial) echo "$NSLINE" | grep -q '^namespace: serial ' || die "the serial-only namespace is not recorded by its serial number: $NSLINE" ;;
esac
say "joined with default identity flags on the $IDS namespace: $NSLINE"
report "$A"
G3=$(gen_of n3)
say "n3 generation $G3; probe from host C (n3) before the fence:"
fenced probe --block-device "$C" $E --node-id n3 --generation "$G3" \
  || die "n3 could not write before being fenced"

say "SIGSTOP n3 (pid $PID3)"
kill -STOP "$PID3"
T0=$(t)
bumped() { [ "$(gen_of n3)" = $((G3 + 1)) ]; }
until_ 90 "n3's fence" bumped
say "n3 fenced: generation $G3 -> $(gen_of n3) ($(awk "BEGIN{print $(t)-$T0}")s after SIGSTOP)"
grep -h '"node fenced"\|node fenced' /tmp/n1.log /tmp/n2.log | tail -n 1
report "$A"
fenced status $E

say "SIGCONT n3"
kill -CONT "$PID3"
out=$(fenced probe --block-device "$C" $E --node-id n3 --generation "$G3")
rc=$?
echo "$out"
[ $rc = 10 ] || die "probe after the fence was not refused (rc $rc)"
echo "$out" | grep -q "write at offset .*REFUSED" || die "write from host C was not refused"
echo "$out" | grep -q "guarded by n3@$G3: REFUSED" || die "guarded metadata txn was not refused"
wait "$PID3"; rc3=$?
say "n3 exited with status $rc3"
[ $rc3 = 3 ] || die "n3 did not self-fence (exit $rc3)"
grep -q "SELF-FENCED" /tmp/n3.log || die "no self-fence line in n3's log"
grep "SELF-FENCED" /tmp/n3.log | tail -n 1
[ "$(grep -c 'registered on the device' /tmp/n3.log)" = 1 ] || die "n3 registered more than once"
report "$A"

say "fenced leave n1"
fenced leave --pid-file /tmp/n1.pid || die "leave failed"
wait "$PID1"; rc1=$?
[ $rc1 = 0 ] || die "n1 exit status $rc1 after leave"
sleep 5
G1=$(gen_of n1)
[ "$G1" = 0 ] || die "n1 was fenced after leaving (generation $G1)"
fenced status $E
K2=$(key_of n2); K4=$(key_of n4)
# Same key through host C first, so the report never lacks n2's key. Done before n4
# starts: whenever n4 dies (even on its own), n2's preempt goes through host B.
nvme-resv register "$C" --nrkey "$K2" >/dev/null || die "registering n2's key through host C failed"
nvme-resv register "$B" --rrega unregister --crkey "$K2" >/dev/null || die "unregistering host B failed"
say "refused preempt: host B unregistered (n2's key $K2 now registered through host C only); n4 joins on host A"
fenced run --node-id n4 --instance-id guest-n4 --block-device "$A" --fencer nvme \
  --etcd-endpoints $EP --root $ROOT $(sec n4) --ttl-secs $TTL4 --sweep-secs 3 --claim-ttl-secs 30 \
  --pid-file /tmp/n4.pid >/tmp/n4.log 2>&1 &
PID4=$!
registered4() { grep -q "registered on the device" /tmp/n4.log; }
until_ 60 "n4 to join and register" registered4
say "SIGKILL n4 (pid $PID4)"
kill -KILL "$PID4"; wait "$PID4" 2>/dev/null
# In n2's log: refusals of n4's fence naming the device's answer, and the sweep's
# "fence owed" line for n4 (one per sweep).
refused4() { grep 'fence NOT confirmed' /tmp/n2.log | grep 'n4' | grep -c 'Reservation Conflict'; }
owed4() { grep 'fence owed' /tmp/n2.log | grep -c 'n4'; }
first() { [ "$(refused4)" -ge 1 ]; }
until_ 30 "n2's first refused preempt of n4" first
T4=$(t); S0=$(owed4); R0=$(refused4)
two_sweeps() { [ "$(owed4)" -ge $((S0 + 2)) ]; }
until_ 20 "two sweeps retrying n4's fence" two_sweeps
S1=$(owed4); T6=$(t)
each_refused() { [ $(($(refused4) - R0)) -ge $((S1 - S0)) ]; }
until_ 15 "a refusal logged by each of the $((S1 - S0)) sweeps" each_refused
R1=$(refused4)
say "n4's fence retried by $((S1 - S0)) sweeps in $(awk "BEGIN{print $T6-$T4}")s, each refused (Reservation Conflict) and logged: $R1 refusals in all"
say "n4's refusals at (n2's log, UTC): $(grep 'fence NOT confirmed' /tmp/n2.log | grep 'n4' | awk '{print substr($1, 12, 10)}' | tr '\n' ' ')"
grep 'fence NOT confirmed' /tmp/n2.log | grep 'n4' | tail -n 1
R4=$(row_of n4)
echo "$R4"
echo "$R4" | grep -q ' OWED ' || die "n4's fence is not owed"
[ "$(echo "$R4" | awk '{print $3}')" = 0 ] || die "n4's generation was bumped by a refused fence"
report "$A" | grep -q "${K4#0x}" || die "n4's key is gone although every preempt was refused"
nvme-resv register "$B" --nrkey "$K2" >/dev/null || die "registering host B again failed"
nvme-resv register "$C" --rrega unregister --crkey "$K2" >/dev/null || die "unregistering host C failed"
T5=$(t)
say "host B registered again"
bumped4() { [ "$(gen_of n4)" = 1 ]; }
until_ 20 "n4's fence once the device accepts the preempt" bumped4
say "n4 fenced: generation 0 -> 1 ($(awk "BEGIN{print $(t)-$T5}")s after the cause was removed)"
sleep 3 # one more sweep: nothing left to do
R4=$(row_of n4)
[ "$(echo "$R4" | awk '{print $3}')" = 1 ] || die "n4 bumped more than once"
echo "$R4" | grep -q ' OWED ' && die "n4's fence still owed"
[ "$(grep 'node fenced' /tmp/n2.log | grep -c 'n4')" = 1 ] || die "n4 not fenced exactly once"
report "$A" | grep -q "${K4#0x}" && die "n4's key survived its fence"
say "PASS: refused preempts: n4's fence stayed owed and unbumped through $((S1 - S0)) sweeps, each logged; completed once when host B was registered again"
say "PASS: n3 fenced once (preempted, verified, bumped), refused by the device and the guard, self-fenced; n1 left unfenced"
say "the fences explained: fenced audit"
fenced audit $E || die "fenced audit failed"
fenced check $E; say "fenced check exit status $?"
kill "$PID2" 2>/dev/null; wait "$PID2" 2>/dev/null
kill "$ETCD"; wait "$ETCD" 2>/dev/null
exit 0
