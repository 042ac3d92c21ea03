#!/bin/sh
# The main-job demo, inside the hwtests guest (busybox sh): etcd + three `fenced`
# daemons on the three loop hosts of one reservation-capable namespace.
#   1. all three join, register their keys, one holds Write Exclusive - Registrants Only
#   2. SIGSTOP n3 until its lease expires: the survivors preempt its key, verify, bump
#   3. SIGCONT n3: a write from its host fails with ReservationConflict, a metadata
#      transaction guarded by its old generation is refused, and the daemon self-fences
#      (exit 3) without re-registering its key
#   4. `fenced leave` on n1: departs cleanly, is not fenced
# Run from the host with fenced/scenarios/run-guest-demo.sh. Prints a timeline.
set -u
A=${HWTEST_NVME_HOSTS%%,*}; rest=${HWTEST_NVME_HOSTS#*,}; B=${rest%%,*}; C=${rest#*,}
EP=http://127.0.0.1:2379
ROOT=/demo
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "demo[$(t)s]: $*"; }
die() { say "FAIL: $*"; for f in /tmp/n1.log /tmp/n2.log /tmp/n3.log /tmp/etcd.log; do echo "--- $f"; tail -n 30 "$f"; done; exit 1; }
# until_ SECONDS WHAT CMD...: poll CMD every 0.5 s for at most SECONDS.
until_() {
  lim=$1; what=$2; shift 2; start=$(t)
  until "$@"; do
    awk "BEGIN{exit !($(t) - $start > $lim)}" && die "timed out after ${lim}s waiting for $what"
    sleep 0.5
  done
}
gen_of() { fenced status --etcd-endpoints $EP --root $ROOT | sed -n 's/^generations: *//p' | tr ' ' '\n' | sed -n "s/^$1=//p"; }
members() { fenced status --etcd-endpoints $EP --root $ROOT | sed -n 's/^members: *//p'; }
report() { nvme resv-report "$1" --eds 2>/dev/null || nvme-resv report "$1" 2>/dev/null; }
key_of() { nvme-resv key-for-node "$1" 2>/dev/null; }

say "hosts: A=$A B=$B C=$C"
mkdir -p /tmp/etcd
etcd --name g1 --data-dir /tmp/etcd/data --listen-client-urls $EP --advertise-client-urls $EP \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster g1=http://127.0.0.1:2380 >/tmp/etcd.log 2>&1 &
ETCD=$!
healthy() { wget -qO- $EP/health 2>/dev/null | grep -q true; }
until_ 60 "etcd health" healthy
say "etcd healthy (pid $ETCD)"

n=1
for dev in $A $B $C; do
  fenced run --node-id n$n --instance-id guest-n$n --block-device "$dev" --fencer nvme \
    --etcd-endpoints $EP --root $ROOT --ttl-secs 5 --sweep-secs 3 --claim-ttl-secs 30 \
    --seed-arenas a1,a2,a3 --arenas 1 --pid-file /tmp/n$n.pid >/tmp/n$n.log 2>&1 &
  eval "PID$n=$!"
  n=$((n + 1))
done
three() { [ "$(members | wc -w)" = 3 ]; }
until_ 120 "three members" three
say "three members: $(members)"
fenced status --etcd-endpoints $EP --root $ROOT
report "$A"
G3=$(gen_of n3)
say "n3 generation $G3; probe from host C (n3) before the fence:"
fenced probe --block-device "$C" --etcd-endpoints $EP --root $ROOT --node-id n3 --generation "$G3" \
  || die "n3 could not write before being fenced"

say "SIGSTOP n3 (pid $PID3)"
kill -STOP "$PID3"
T0=$(t)
bumped() { [ "$(gen_of n3)" = $((G3 + 1)) ]; }
until_ 90 "n3's fence" bumped
say "n3 fenced: generation $G3 -> $(gen_of n3) ($(awk "BEGIN{print $(t)-$T0}")s after SIGSTOP)"
grep -h '"node fenced"\|node fenced' /tmp/n1.log /tmp/n2.log | tail -n 1
report "$A"
fenced status --etcd-endpoints $EP --root $ROOT

say "SIGCONT n3"
kill -CONT "$PID3"
out=$(fenced probe --block-device "$C" --etcd-endpoints $EP --root $ROOT --node-id n3 --generation "$G3")
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
fenced status --etcd-endpoints $EP --root $ROOT
say "PASS: n3 fenced once (preempted, verified, bumped), refused by the device and the guard, self-fenced; n1 left unfenced"
kill "$PID2" 2>/dev/null; wait "$PID2" 2>/dev/null
kill "$ETCD"; wait "$ETCD" 2>/dev/null
exit 0
