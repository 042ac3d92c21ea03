#!/bin/sh
# A restart does not unfence; leave unregisters before it returns anything (issue 14,
# parts 1 and 4), inside the hwtests guest (busybox sh): etcd + fenced daemons n1, n2,
# n3 on the loop hosts A, B, C of one reservation-capable nvmet namespace.
#   1. The example application (fenced/examples/app_writer.rs) writes from host C as
#      n3. SIGSTOP n3's daemon until its lease expires: n1/n2 preempt its key and bump
#      it; the application's next write fails (EBADE, or EIO if it was in flight and
#      aborted) and it stops (exit 10). SIGCONT:
#      n3 self-fences, runs its --on-fence exec hook, exits 3.
#   2. n3's daemon starts again on the same boot: refused with exit status 5; its
#      O_DIRECT write from host C still fails (EBADE, reservation conflict); n3's keys
#      in etcd are unchanged and its key is not registered again.
#   3. `fenced unfence --node-id n3`: n3 joins, registers, writes.
#   4. n3 SIGKILLed, fenced again, refused again on the same boot; a new boot id (what a
#      reboot gives) and it joins and writes.
#   5. `fenced leave` n3: polled while it leaves, its key is gone from the report
#      before its arena is back in the pool and before its departure marker appears.
#   6. `fenced leave` n1 while its key is also registered through another host (the
#      unregister cannot make the key disappear): no arena returned, no departure
#      marker, exit 4, and n2 fences n1 as usual.
# Each daemon's boot id is read from /tmp/boot-<node> (FENCED_BOOT_ID_FILE, a test-only
# override), seeded from the guest's real /proc/sys/kernel/random/boot_id: the loop hosts
# share one kernel, and a real reboot of the guest would lose the nvmet state, so a
# reboot is simulated by writing a new id.
# Run from the host with fenced/scenarios/run-guest-restart.sh.
set -u
A=${HWTEST_NVME_HOSTS%%,*}; rest=${HWTEST_NVME_HOSTS#*,}; B=${rest%%,*}; C=${rest#*,}
EP=http://127.0.0.1:2379
ROOT=/rs
T00=$(cut -d' ' -f1 /proc/uptime)
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "restart[$(t)s]: $*"; }
die() { say "FAIL: $*"; for f in /tmp/n1.log /tmp/n2.log /tmp/n3.log /tmp/app.log /tmp/keys.log /tmp/watch.log; do echo "--- $f"; tail -n 30 "$f"; done; exit 1; }
until_() {
  lim=$1; what=$2; shift 2; start=$(t)
  until "$@"; do
    awk "BEGIN{exit !($(t) - $start > $lim)}" && die "timed out after ${lim}s waiting for $what"
    sleep 0.3
  done
}
# `fenced status` rows: NODE MEMBER GEN first (no spaces in them), after a summary and a header line.
row_of() { fenced status --etcd-endpoints $EP --root $ROOT | awk -v n="$1" 'NR > 2 && $1 == n'; }
gen_of() { row_of "$1" | awk '{print $3}'; }
members() { fenced status --etcd-endpoints $EP --root $ROOT | awk 'NR > 2 && $2 == "yes" {printf "%s ", $1}'; }
is_member() { members | tr ' ' '\n' | grep -qx "$1"; }
report() { nvme-resv report "$A" 2>/dev/null; }
key_of() { nvme-resv key-for-node "$1" 2>/dev/null; }
has_key() { report | grep -q "${1#0x}"; }
ectl() { etcdctl --endpoints $EP "$@"; }
# n3's keys with their mod revisions (liveness included: n3 is not running).
keys_n3() { ectl get --prefix $ROOT/ -w fields | awk '/^"Key"/{k=$3} /^"ModRevision"/{print k, $3}' | grep '/n3[/"]'; }
# bounded SECONDS LOG CMD...: CMD's exit status, or 124 if it still ran after SECONDS
# (then it is killed): a start that should be refused but joined must not hang the run.
bounded() {
  lim=$1; log=$2; shift 2
  "$@" >"$log" 2>&1 &
  bp=$!; start=$(t)
  while kill -0 "$bp" 2>/dev/null; do
    if awk "BEGIN{exit !($(t) - $start > $lim)}"; then kill "$bp"; wait "$bp"; return 124; fi
    sleep 0.2
  done
  wait "$bp"
}
probe_c() { fenced probe --block-device "$C" --etcd-endpoints $EP --root $ROOT; }

start() { # node dev [extra args...]
  node=$1; dev=$2; shift 2
  FENCED_BOOT_ID_FILE=/tmp/boot-$node fenced run --node-id "$node" --instance-id "guest-$node" \
    --block-device "$dev" --fencer nvme --etcd-endpoints $EP --root $ROOT --ttl-secs 5 \
    --sweep-secs 2 --claim-ttl-secs 30 --seed-arenas a1,a2,a3 --arenas 1 \
    --pid-file "/tmp/$node.pid" "$@" >>"/tmp/$node.log" 2>&1 &
  eval "PID_$node=$!"
}

say "hosts: A=$A B=$B C=$C"
mkdir -p /tmp/etcd
etcd --name g1 --data-dir /tmp/etcd/data --listen-client-urls $EP --advertise-client-urls $EP \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster g1=http://127.0.0.1:2380 >/tmp/etcd.log 2>&1 &
ETCD=$!
healthy() { wget -qO- $EP/health 2>/dev/null | grep -q true; }
until_ 60 "etcd health" healthy
BOOT=$(cat /proc/sys/kernel/random/boot_id)
for n in n1 n2 n3; do echo "$BOOT" >/tmp/boot-$n; done
K1=$(key_of n1); K3=$(key_of n3)
HOOK='exec:echo "hook: $FENCED_NODE_ID at generation $FENCED_GENERATION: $FENCED_FENCE_REASON" >/tmp/n3-hook'
start n1 "$A"; start n2 "$B"; start n3 "$C" --on-fence "$HOOK"
three() { [ "$(members | wc -w)" = 3 ]; }
until_ 90 "three members" three
say "three members: $(members); boot id $BOOT"
ectl get $ROOT/boot/n3 --print-value-only | grep -q "\"boot_id\":\"$BOOT\"" || die "join did not record n3's boot id"
ectl get $ROOT/boot/n3 --print-value-only

# 1. fence n3 under its application's writes; the daemon self-fences and runs its hook.
G3=$(gen_of n3)
app_writer $EP $ROOT/ n3 "$C" >/tmp/app.log 2>&1 &
APP=$!
writing() { [ "$(grep -c 'wrote block' /tmp/app.log)" -ge 3 ]; }
until_ 30 "the application to write" writing
say "application writing as n3 from host C: $(tail -n 1 /tmp/app.log)"
say "SIGSTOP n3"
kill -STOP "$PID_n3"
bumped() { [ "$(gen_of n3)" = $((G3 + 1)) ]; }
until_ 60 "n3's fence" bumped
say "n3 fenced: generation $G3 -> $(gen_of n3)"
wait "$APP"; rc=$?
grep 'FENCED\|generation' /tmp/app.log | grep -v 'wrote block'
[ $rc = 10 ] || die "the application did not stop with status 10 (got $rc)"
# The write refused is EBADE, or EIO when it was in flight at the preempt-and-abort
# (nvmet aborts it: "I/O Error (sct 0x0 / sc 0x6)" in dmesg); step 2 then shows the
# device refusing host C with EBADE.
grep -q "FENCED: write at .*\(EBADE\|Input/output error\)" /tmp/app.log ||
    die "the application did not stop on EBADE or an aborted write (EIO)"
say "application stopped after $(grep -c 'wrote block' /tmp/app.log) writes; SIGCONT n3"
kill -CONT "$PID_n3"
wait "$PID_n3"; rc=$?
[ $rc = 3 ] || die "n3 did not self-fence (exit $rc)"
cat /tmp/n3-hook 2>/dev/null || die "n3's on-fence hook did not run"
grep -q "hook: n3 at generation $G3" /tmp/n3-hook || die "hook environment wrong"
has_key "$K3" && die "n3's key still registered after its fence"

# 2. same boot: refused.
before=$(keys_n3)
T2=$(t)
bounded 30 /tmp/n3-refused.log env FENCED_BOOT_ID_FILE=/tmp/boot-n3 fenced run --node-id n3 \
  --instance-id guest-n3 --block-device "$C" --fencer nvme --etcd-endpoints $EP --root $ROOT \
  --ttl-secs 5 --sweep-secs 2 --seed-arenas a1,a2,a3 --arenas 1
rc=$?
say "n3 restarted on the same boot: exit $rc after $(awk "BEGIN{print $(t)-$T2}")s"
cat /tmp/n3-refused.log | grep '^fenced:'
[ $rc = 5 ] || die "restart of fenced n3 on the same boot not refused with 5 (got $rc)"
grep -q "registered on the device" /tmp/n3-refused.log && die "the refused start registered n3's key"
has_key "$K3" && die "n3's key registered again"
after=$(keys_n3)
[ "$before" = "$after" ] || die "n3's keys changed: before [$before] after [$after]"
say "n3's keys in etcd unchanged (key, mod revision):"; echo "$after"
out=$(probe_c); rc=$?
echo "$out"
[ $rc = 10 ] || die "probe from host C after the refused restart was not refused"
echo "$out" | grep -qi "REFUSED.*\(EBADE\|exchange\|conflict\)" || die "write from host C not refused with a reservation conflict"

# 3. unfence, then it joins and writes.
fenced unfence --etcd-endpoints $EP --root $ROOT --node-id n3 --operator guest-test \
  --reason "guest test: n3's application stopped" || die "unfence failed"
ectl get --prefix $ROOT/audit/n3/ --print-value-only | grep '"action":"unfence"' || die "no unfence audit record"
start n3 "$C"
registered3() { has_key "$K3"; }
until_ 30 "n3 to join and register after unfence" registered3
is_member n3 || die "n3 not a member after unfence"
probe_c || die "n3 cannot write after unfence"
fenced unfence --etcd-endpoints $EP --root $ROOT --node-id n3 --reason x 2>&1 | grep -q "it is a member" \
  || die "unfence of a member not refused"

# 4. fenced again, refused again; a new boot id joins.
G3=$(gen_of n3)
say "SIGKILL n3"
kill -KILL "$PID_n3"; wait "$PID_n3" 2>/dev/null
until_ 60 "n3's second fence" bumped
bounded 30 /tmp/n3-refused.log env FENCED_BOOT_ID_FILE=/tmp/boot-n3 fenced run --node-id n3 \
  --instance-id guest-n3 --block-device "$C" --fencer nvme --etcd-endpoints $EP --root $ROOT
rc=$?
[ $rc = 5 ] || die "second restart on the same boot not refused with 5 (got $rc)"
say "refused again (exit 5); new boot id for n3's host"
cat /proc/sys/kernel/random/uuid >/tmp/boot-n3
start n3 "$C"
until_ 30 "n3 to join and register after a new boot id" registered3
probe_c || die "n3 cannot write after a new boot id"

# 5. leave order: while n3 leaves, a watch on etcd timestamps each event as it arrives,
# and a poller timestamps each report of the device with the time it was *asked*. A
# report asked after the arena or departure event arrived that still lists n3's key
# would prove the wrong order.
A3=$(ectl get --prefix $ROOT/arena_node/n3/ --keys-only | sed -n "s|^$ROOT/arena_node/n3/||p" | head -n1)
[ -n "$A3" ] || die "n3 owns no arena"
mkfifo /tmp/watch.fifo
etcdctl --endpoints $EP watch --prefix $ROOT/ >/tmp/watch.fifo 2>/dev/null &
WATCH=$!
(while read -r line; do echo "$(t) $line"; done </tmp/watch.fifo >/tmp/watch.log) &
READER=$!
(while :; do s=$(t); if has_key "$K3"; then echo "$s 1"; else echo "$s 0"; fi; done >/tmp/keys.log) &
POLL=$!
sleep 1
fenced leave --pid-file /tmp/n3.pid || die "leave of n3 failed"
wait "$PID_n3"; rc=$?
[ $rc = 0 ] || die "n3 exit $rc after leave"
sleep 1
kill "$POLL" "$WATCH"; wait "$POLL" "$WATCH" "$READER" 2>/dev/null
first_event() { grep -m1 " $ROOT/$1\$" /tmp/watch.log | cut -d' ' -f1; }
# The arena returns when n3's claim key goes (arena_claim/<arena>/<node>; the watch
# started after n3 claimed it, so its first event is the leave's DELETE).
RF=$(first_event "arena_claim/$A3/n3"); RD=$(first_event "departed/n3")
[ -n "$RF" ] && [ -n "$RD" ] || die "no arena or departure event seen: $(cat /tmp/watch.log)"
LAST1=$(grep ' 1$' /tmp/keys.log | tail -n 1 | cut -d' ' -f1)
[ -n "$LAST1" ] || die "the poller never saw n3's key registered"
awk "BEGIN{exit !($LAST1 < $RF && $LAST1 < $RD)}" \
  || die "n3's key listed by a report asked at ${LAST1}s, after its arena (${RF}s) or departure (${RD}s) event"
say "leave order: key last seen at ${LAST1}s (next report without it), arena $A3 free at ${RF}s, departure at ${RD}s ($(wc -l </tmp/keys.log) reports)"
grep "unregister\|arena returned\|departed:" /tmp/n3.log | tail -n 3

# 6. unregister cannot remove the key: no departure, fenced as usual.
G1=$(gen_of n1)
nvme-resv register "$C" --nrkey "$K1" >/dev/null || die "registering n1's key through host C failed"
A1=$(ectl get --prefix $ROOT/arena_node/n1/ --keys-only | sed -n "s|^$ROOT/arena_node/n1/||p" | head -n1)
fenced leave --pid-file /tmp/n1.pid
wait "$PID_n1"; rc=$?
grep "leave incomplete" /tmp/n1.log | tail -n 1
[ $rc = 4 ] || die "n1's leave with its key still registered exited $rc, not 4"
[ -n "$(ectl get $ROOT/departed/n1 --keys-only)" ] && die "departure announced although n1's key stayed registered"
[ -z "$(ectl get $ROOT/arena_claim/$A1/n1 --keys-only)" ] && die "n1's arena $A1 returned although its key stayed registered"
bumped1() { [ "$(gen_of n1)" = $((G1 + 1)) ]; }
until_ 60 "n1's fence after its incomplete leave" bumped1
has_key "$K1" && die "n1's key survived its fence"
say "n1: leave incomplete (exit 4), no departure, fenced by n2: generation $G1 -> $(gen_of n1)"

say "PASS: restart refused on the same boot (exit 5, etcd and device untouched, write still refused); unfence and a new boot id join; leave unregisters first; a failed unregister announces nothing ($(awk "BEGIN{print $(t)-$T00}")s)"
kill "$PID_n2" 2>/dev/null; wait "$PID_n2" 2>/dev/null
kill "$ETCD"; wait "$ETCD" 2>/dev/null
exit 0
