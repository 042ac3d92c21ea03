#!/bin/sh
# Issue 14 section 2 inside the hwtests guest (busybox sh), on the kernel NVMe target
# serving two reservation-capable namespaces (run --resv-namespaces 2): nsid 1 on hosts
# A, B, C ($HWTEST_NVME_HOSTS) and nsid 3 ($HWTEST_NVME_HOSTS2), each with its own NGUID.
#   1. n1 (host A) and n2 (host B) join on nsid 1: the first join records its identity.
#   2. n3 starts with --block-device = host C's nsid 3: refused before registering
#      (exit 1, both identities named); nothing of n3 in etcd or on either namespace.
#   3. A controller whose --block-device is nsid 3 refuses to fence: n3 is let in on
#      nsid 3 (the record is pointed at nsid 3 for its join, as a node started before
#      the check existed would have joined, then put back) and is the only controller
#      when n2 dies. Every attempt fails at sever naming both identities; n2's fence
#      stays owed, unbumped, audited; n2's key stays registered on nsid 1.
#   3b. (issue 26, hole 2) n3 is SIGKILLed (its key stays registered on nsid 3) and an
#      operator runs `fenced attest --node-id n2 --block-device <nsid 3> --own-node-id
#      n3`: refused before anything is written, both identities named; n2 stays owed at
#      generation 0 (before the fix: "fenced n2: generation now 1" while n2's key was
#      never on nsid 3).
#   4. n1 joins again on nsid 1: its controller completes the owed fence, once.
# Run from the host with fenced/scenarios/run-guest-namespace.sh.
set -u
A=${HWTEST_NVME_HOSTS%%,*}; rest=${HWTEST_NVME_HOSTS#*,}; B=${rest%%,*}
[ -n "${HWTEST_NVME_HOSTS2:-}" ] || { echo "namespace: FAIL: needs run --resv-namespaces 2"; exit 1; }
rest=${HWTEST_NVME_HOSTS2#*,}; rest=${rest#*,}; C3=${rest%%,*}
EP=http://127.0.0.1:2379
ROOT=/ns
KEY=$ROOT/namespace
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "namespace[$(t)s]: $*"; }
die() { say "FAIL: $*"; for f in /tmp/n1.log /tmp/n2.log /tmp/n3.log /tmp/n3b.log /tmp/etcd.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done; exit 1; }
until_() {
  lim=$1; what=$2; shift 2; start=$(t)
  until "$@"; do
    awk "BEGIN{exit !($(t) - $start > $lim)}" && die "timed out after ${lim}s waiting for $what"
    sleep 0.5
  done
}
st() { fenced status --etcd-endpoints $EP --root $ROOT; }
# `fenced status` rows: NODE MEMBER GEN first, after a summary and a header line.
row_of() { st | awk -v n="$1" 'NR > 2 && $1 == n'; }
gen_of() { row_of "$1" | awk '{print $3}'; }
members() { st | awk 'NR > 2 && $2 == "yes" {printf "%s ", $1}'; }
nguid() { nvme id-ns "$1" -o json | tr -d ' \n' | sed -n 's/.*"nguid":"\([0-9a-f]*\)".*/\1/p'; }
# run_node NAME DEVICE LOG: a daemon in the background, pid in $PID.
run_node() {
  fenced run --node-id "$1" --instance-id "guest-$1" --block-device "$2" --fencer nvme \
    --etcd-endpoints $EP --root $ROOT --ttl-secs 5 --sweep-secs 3 --claim-ttl-secs 30 \
    --pid-file "/tmp/$1.pid" >"$3" 2>&1 &
  PID=$!
}

# Each namespace is named by nvmet's random UUID (Linux's order: UUID before NGUID).
uuid() { nvme-resv capabilities "$1" -o json | tr -d ' \n' | sed -n 's/.*"uuid":"\([0-9a-f-]*\)".*/\1/p'; }
N1=$(nguid "$A"); N3=$(nguid "$C3"); U1=$(uuid "$A"); U3=$(uuid "$C3")
say "host A $A UUID $U1; host C's nsid 3 $C3 UUID $U3"
[ -n "$U1" ] && [ -n "$U3" ] && [ "$U1" != "$U3" ] || die "the two namespaces do not report distinct UUIDs"
say "host A $A NGUID $N1; host C's nsid 3 $C3 NGUID $N3"
[ -n "$N1" ] && [ -n "$N3" ] && [ "$N1" != "$N3" ] || die "the two namespaces do not report distinct NGUIDs"
nvme-resv capabilities "$A" | grep identity
nvme-resv capabilities "$C3" | grep identity

mkdir -p /tmp/etcd
etcd --name g1 --data-dir /tmp/etcd/data --listen-client-urls $EP --advertise-client-urls $EP \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster g1=http://127.0.0.1:2380 >/tmp/etcd.log 2>&1 &
ETCD=$!
healthy() { wget -qO- $EP/health 2>/dev/null | grep -q true; }
until_ 60 "etcd health" healthy
say "etcd healthy"

# 1. The first join records nsid 1. n1 names its device the way udev does on a real
#    host (/dev/disk/by-id/nvme-eui.<NGUID>; the guest has no udev, so the link is made
#    here): the daemon resolves it and logs both names.
mkdir -p /dev/disk/by-id
BYID=/dev/disk/by-id/nvme-eui.$N1
ln -sf "$A" "$BYID"
run_node n1 "$BYID" /tmp/n1.log; PID1=$PID
two() { [ "$(members | wc -w)" = 2 ]; }
one() { [ "$(members | wc -w)" = 1 ]; }
until_ 60 "n1 to join" one
grep 'shared namespace device' /tmp/n1.log | grep "$BYID" | grep -q "device=$A" || die "n1 did not log its by-id path and the device it resolves to"
grep 'shared namespace device' /tmp/n1.log
run_node n2 "$B" /tmp/n2.log; PID2=$PID
until_ 60 "n1 and n2 to join" two
RECORD=$(etcdctl --endpoints $EP get $KEY --print-value-only)
say "recorded at $KEY: $RECORD"
echo "$RECORD" | grep -q "\"nguid\":\"$N1\"" || die "the record is not nsid 1's NGUID"
echo "$RECORD" | grep -q "\"kind\":\"uuid\",\"wwid\":\"uuid.$U1\"" || die "the record does not name nsid 1 by its UUID"
st | grep '^namespace:'

# 2. A node on the other namespace is refused before it registers anything.
say "n3 starts with --block-device $C3 (nsid 3)"
run_node n3 "$C3" /tmp/n3.log
wait "$PID"; rc=$?
say "n3 exited with status $rc"
[ $rc = 1 ] || die "n3 on the other namespace was not refused (exit $rc)"
grep 'refuses to join' /tmp/n3.log || die "no refusal line in n3's log"
grep 'refuses to join' /tmp/n3.log | grep "UUID $U1" | grep -q "UUID $U3" || die "the refusal does not name both identities"
members | grep -q n3 && die "n3 became a member"
[ -z "$(row_of n3)" ] || die "n3 has records in etcd: $(row_of n3)"
K3=$(nvme-resv key-for-node n3); K2=$(nvme-resv key-for-node n2)
nvme resv-report "$C3" --eds -o json | tr -d ' \n' | grep -q '"regctl":0' || die "something is registered on nsid 3: $(nvme resv-report "$C3" --eds)"
nvme-resv report "$A" | grep -q "${K3#0x}" && die "n3's key is registered on nsid 1"
say "PASS: n3 refused on nsid 3 before registering; nothing of it in etcd or on either namespace"

# 3. A controller on the other namespace: n3 joins nsid 3 while the record names it,
#    then the record is put back; n1 leaves, so n3 is n2's only possible fencer.
fenced leave --pid-file /tmp/n1.pid || die "n1's leave failed"
wait "$PID1"
# The record naming nsid 3 is written in the form of a fenced from before records
# said their kind (NGUID only, compared by NGUID): nsid 1's record names it by its UUID,
# which an NGUID substitution would not change.
SUBNQN=$(echo "$RECORD" | sed -n 's/.*"subnqn":"\([^"]*\)".*/\1/p')
etcdctl --endpoints $EP put $KEY "{\"nguid\":\"$N3\",\"eui64\":\"0000000000000000\",\"subnqn\":\"$SUBNQN\"}" >/dev/null || die "etcdctl put"
run_node n3 "$C3" /tmp/n3b.log; PID3=$PID
until_ 60 "n3 to join on nsid 3" two
etcdctl --endpoints $EP put $KEY "$RECORD" >/dev/null || die "etcdctl put back"
say "n3 runs with --block-device $C3 (nsid 3); the record names nsid 1 again: $(etcdctl --endpoints $EP get $KEY --print-value-only)"
say "SIGKILL n2 (pid $PID2)"
kill -KILL "$PID2"; wait "$PID2" 2>/dev/null
refusals() { grep 'fence NOT confirmed' /tmp/n3b.log | grep 'n2' | grep -c "not the cluster's shared namespace"; }
twice() {
  if grep 'node fenced' /tmp/n3b.log | grep -q 'node=n2'; then
    grep 'node fenced' /tmp/n3b.log | grep 'node=n2' | tail -n 1
    die "n3's controller on nsid 3 'confirmed' n2's fence there (n2's key was never on nsid 3)"
  fi
  [ "$(refusals)" -ge 2 ]
}
until_ 90 "two refused attempts on n2 by n3's controller" twice
grep 'fence NOT confirmed' /tmp/n3b.log | grep n2 | tail -n 1
grep 'fence NOT confirmed' /tmp/n3b.log | grep n2 | tail -n 1 | grep "UUID $U1" | grep -q "UUID $U3" || die "the refusal does not name both identities"
st
row_of n2 | grep -q 'OWED' || die "n2's fence is not owed: $(row_of n2)"
[ "$(gen_of n2)" = 0 ] || die "n2 was bumped without evidence (generation $(gen_of n2))"
grep -q 'node fenced' /tmp/n3b.log && die "n3's controller fenced someone"
nvme-resv report "$A" | grep -q "${K2#0x}" || die "n2's key left nsid 1 although nobody preempted it there"
say "PASS: the controller on nsid 3 refused $(refusals) times; n2 owed, generation 0, its key still on nsid 1"

# 3b. `fenced attest --block-device` on the other namespace is refused like the
#     controller (issue 26, hole 2). n3 is killed first (its key stays on nsid 3), so no
#     controller runs; a claim of n3's last attempt may linger: retry while "being fenced".
kill -KILL "$PID3"; wait "$PID3" 2>/dev/null
n3gone() { ! members | grep -q n3; }
until_ 60 "n3's membership to expire" n3gone
nvme-resv report "$C3" | grep -q "${K3#0x}" || die "n3's key left nsid 3"
REV0=$(etcdctl --endpoints $EP get / -w json | sed -n 's/.*"revision":\([0-9]*\).*/\1/p')
attest_other() {
  fenced attest --etcd-endpoints $EP --root $ROOT --operator alice --reason "n2 powered off" \
    --node-id n2 --block-device "$C3" --own-node-id n3 >/tmp/attest.out 2>&1; arc=$?
  cat /tmp/attest.out
  [ $arc = 0 ] && die "attest on nsid 3 succeeded"
  grep -q "generation now" /tmp/attest.out && die "attest on nsid 3 bumped n2"
  grep -q "not the cluster's shared namespace" /tmp/attest.out
}
until_ 60 "attest on nsid 3 to be refused for the namespace" attest_other
grep "not the cluster's shared namespace" /tmp/attest.out | grep -q "UUID $U1" || die "the attest refusal does not name the recorded UUID $U1"
grep "not the cluster's shared namespace" /tmp/attest.out | grep -q "UUID $U3" || die "the attest refusal does not name nsid 3's UUID $U3"
[ "$(gen_of n2)" = 0 ] || die "n2 was bumped by the attest on nsid 3 (generation $(gen_of n2))"
nvme-resv report "$A" | grep -q "${K2#0x}" || die "n2's key left nsid 1"
say "PASS: attest --block-device $C3 refused, both identities named; n2 owed at generation 0 (etcd revision $REV0 before)"

# 4. A controller on the shared namespace completes it.
run_node n1 "$A" /tmp/n1.log; PID1=$PID
bumped() { [ "$(gen_of n2)" = 1 ]; }
until_ 90 "n1 to complete n2's fence" bumped
sleep 3
[ "$(gen_of n2)" = 1 ] || die "n2 bumped more than once"
row_of n2 | grep -q 'OWED' && die "n2's fence still owed: $(row_of n2)"
nvme-resv report "$A" | grep -q "${K2#0x}" && die "n2's key survived its fence"
grep 'node fenced' /tmp/n1.log | grep n2 | tail -n 1
say "PASS: n1 on nsid 1 completed n2's owed fence once"
kill "$PID1" "$PID3" 2>/dev/null; wait "$PID1" "$PID3" 2>/dev/null
kill "$ETCD"; wait "$ETCD" 2>/dev/null
exit 0
