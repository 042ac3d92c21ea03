#!/bin/sh
# `fenced attest --block-device` inside the hwtests guest (busybox sh), on the kernel
# NVMe target's reservation-capable namespace and its three loop hosts A, B, C
# (issue 14, part 3: the attesting host preempts and verifies first, and records both).
#   1. etcd; n2 runs on host B (`--fencer nvme`), registers its key, claims an arena;
#      B can write
#   2. host A registers n1's key by hand (what the attesting host's own fenced does)
#   3. SIGKILL n2: no controller is left, nobody fences it, its key stays registered
#   4. refusals touch neither etcd nor the device: a node that never joined; a host
#      whose key is not registered (--own-node-id n3)
#   5. attest n2 --block-device A --own-node-id n1: exit 0; n2's key is gone from the
#      report; a write from host B is refused by the device; generation 0 -> 1; the
#      audit record names operator+nvme, the reason verbatim and the device evidence;
#      n2's arena returns to the free pool in the same transaction
#      (issue 26) before it, n2's host B releases the reservation: both keys stay
#      registered, no reservation, B writes; a preempt alone would cut nothing, so the
#      attest acquires the reservation first and the audit's evidence says so (before
#      the fix: confirmed while host B kept writing)
#   6. a second attest: "already fenced at generation 1", nothing written
# Run from the host:
#   fenced/scenarios/run-guest-scenario.sh guest-attest.sh
# (or by hand:)
#   cargo build -p fenced --bin fenced
#   hwtests/guest/run --scenario fenced/scenarios/guest-attest.sh \
#     --add "$(command -v etcd)=/usr/local/bin/etcd" \
#     --add "$(command -v etcdctl)=/usr/local/bin/etcdctl" \
#     --add "$CARGO_TARGET_DIR/debug/fenced=/usr/local/bin/fenced"
set -u
A=${HWTEST_NVME_HOSTS%%,*}; rest=${HWTEST_NVME_HOSTS#*,}; B=${rest%%,*}
EP=http://127.0.0.1:2379
ROOT=/attest
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "attest[$(t)s]: $*"; }
die() { say "FAIL: $*"; for f in /tmp/n2.log /tmp/etcd.log; do echo "--- $f"; tail -n 30 "$f"; done; exit 1; }
until_() {
  lim=$1; what=$2; shift 2; start=$(t)
  until "$@"; do
    awk "BEGIN{exit !($(t) - $start > $lim)}" && die "timed out after ${lim}s waiting for $what"
    sleep 0.5
  done
}
ectl() { ETCDCTL_API=3 etcdctl --endpoints $EP "$@"; }
rev() { ectl get / -w json | sed -n 's/.*"revision":\([0-9]*\).*/\1/p'; }
gen_of() { ectl get "$ROOT/gen/$1" --print-value-only; }
report() { nvme-resv report "$1" 2>/dev/null; }
key_of() { nvme-resv key-for-node "$1" 2>/dev/null; }
attest() {
  fenced attest --etcd-endpoints $EP --root $ROOT --operator alice \
    --reason "n2's host powered off at the PDU, ticket 7" "$@"
}

say "hosts: A=$A B=$B"
mkdir -p /tmp/etcd
etcd --name g1 --data-dir /tmp/etcd/data --listen-client-urls $EP --advertise-client-urls $EP \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster g1=http://127.0.0.1:2380 >/tmp/etcd.log 2>&1 &
ETCD=$!
healthy() { wget -qO- $EP/health 2>/dev/null | grep -q true; }
until_ 60 "etcd health" healthy

fenced run --node-id n2 --instance-id guest-n2 --block-device "$B" --fencer nvme \
  --etcd-endpoints $EP --root $ROOT --ttl-secs 3 --sweep-secs 3 \
  --seed-arenas a1,a2 --arenas 1 >/tmp/n2.log 2>&1 &
PID2=$!
registered() { grep -q "registered on the device" /tmp/n2.log; }
until_ 60 "n2 to join and register" registered
K1=$(key_of n1); K2=$(key_of n2); K3=$(key_of n3)
nvme-resv register "$A" --nrkey "$K1" >/dev/null || die "registering n1's key through host A failed"
report "$A"
fenced probe --block-device "$B" >/dev/null || die "host B could not write before the fence"
say "n2 ($K2) on host B writes; n1's key $K1 registered through host A"

kill -KILL "$PID2"; wait "$PID2" 2>/dev/null
gone() { [ -z "$(ectl get $ROOT/membership/n2 --print-value-only)" ]; }
until_ 30 "n2's membership to expire" gone
say "n2 SIGKILLed, membership expired; its key is still registered:"
report "$A" | grep -q "${K2#0x}" || die "n2's key vanished before any fence"

R0=$(rev)
attest --node-id ghost --block-device "$A" --own-node-id n1 2>/tmp/o; rc=$?
cat /tmp/o
[ $rc != 0 ] && grep -q "no such node" /tmp/o || die "a node that never joined was not refused (rc $rc)"
attest --node-id n2 --block-device "$A" --own-node-id n3 2>/tmp/o; rc=$?
cat /tmp/o
[ $rc != 0 ] && grep -q "is not registered on it" /tmp/o || die "an unregistered attesting host was not refused (rc $rc)"
[ "$(rev)" = "$R0" ] || die "a refused attest wrote to etcd (revision $R0 -> $(rev))"
report "$A" | grep -q "${K2#0x}" || die "a refused attest changed the device"
[ "$(gen_of n2)" = 0 ] || die "n2's generation moved: $(gen_of n2)"
say "refusals wrote nothing (revision $R0, n2's key still registered)"

# Issue 26: the reservation released (`nvme resv-release` by its holder, n2's host B),
# both keys still registered: with no reservation every host may write.
nvme-resv release "$B" --crkey "$K2" --rtype 5 >/dev/null || die "releasing the reservation through host B failed"
report "$A"
report "$A" | grep -q "${K2#0x}" || die "n2's key vanished with the release"
[ "$(nvme resv-report "$A" --eds 2>/dev/null | sed -n 's/^rtype *: *//p')" = 0 ] || die "a reservation is still held after the release"
fenced probe --block-device "$B" >/dev/null || die "host B could not write with no reservation held"
say "reservation released: both keys registered, host B writes"

attest --node-id n2 --block-device "$A" --own-node-id n1 >/tmp/o 2>&1 || { cat /tmp/o; die "attest failed"; }
cat /tmp/o
grep -q "fenced n2: generation now 1" /tmp/o || die "no confirmation line"
report "$A"
report "$A" | grep -q "${K2#0x}" && die "n2's key survived the attested fence"
report "$A" | grep -q "${K1#0x}" || die "the attesting host's own key is gone"
out=$(fenced probe --block-device "$B"); rc=$?
echo "$out"
[ $rc = 10 ] && echo "$out" | grep -q "REFUSED" || die "host B's write was not refused after the fence (rc $rc)"
[ "$(gen_of n2)" = 1 ] || die "n2's generation is $(gen_of n2), not 1"
AUD=$(ectl get --prefix "$ROOT/audit/n2/" --print-value-only)
echo "$AUD"
echo "$AUD" | grep -q '"fencer":"operator+nvme"' || die "audit record does not name operator+nvme"
echo "$AUD" | grep -q "attested by alice: n2's host powered off at the PDU, ticket 7" || die "reason not verbatim in the audit record"
echo "$AUD" | grep -q "absent from report" || die "no device evidence in the audit record"
echo "$AUD" | grep -q "acquired before the preempt" || die "the audit's evidence does not say the reservation was acquired"
echo "$AUD" | grep -q '"arenas_released":\["a[12]"\]' || die "n2's arena was not released with the confirmed fence"
[ -z "$(ectl get --prefix $ROOT/arena_node/n2/ --keys-only)" ] || die "n2 still owns an arena"

R1=$(rev)
attest --node-id n2 --block-device "$A" --own-node-id n1 >/tmp/o 2>&1; rc=$?
cat /tmp/o
[ $rc = 0 ] && grep -q "n2 already fenced at generation 1" /tmp/o || die "second attest did not report 'already fenced' (rc $rc)"
[ "$(rev)" = "$R1" ] || die "the second attest wrote to etcd"
[ "$(gen_of n2)" = 1 ] || die "the second attest bumped n2 to $(gen_of n2)"

say "PASS: attest preempted n2's key from host A and verified it gone before fencing (generation 1, host B refused, audit record holds the reason and the device evidence); refusals and the second attest wrote nothing"
kill "$ETCD"; wait "$ETCD" 2>/dev/null
exit 0
