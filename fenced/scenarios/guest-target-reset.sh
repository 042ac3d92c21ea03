#!/bin/sh
# Issue 27 section 3 (invariant 9), inside the hwtests guest (busybox sh): the kernel
# NVMe target keeps no reservation state across a namespace restart (no Persist
# Through Power Loss). Under a running cluster with one host fenced and its writer
# still running:
#   1. three `fenced` daemons on hosts A, B, C; a writer on A (n1's host) and one on
#      C (n3's host) write the namespace in a loop (O_DIRECT dd, one 4 KiB block at a
#      time) and log every write: ok, or refused (EBADE) — they never stop on their own
#      (a misbehaving application, the worst case)
#   2. SIGSTOP n3 until its lease expires: the survivors fence it (a plain preempt:
#      nvmet's preempt-and-abort, with C's writer's commands in flight on a loaded
#      emulated guest, made host C's namespace node go away); C's writes are
#      refused; SIGCONT n3: its daemon self-fences (exit 3), C's writer keeps trying
#   3. the target loses its reservation state: namespace 1 disabled and enabled again
#      through configfs (nvmet starts it with no registrant and no reservation)
#   4. measured: the window (from the reset until C's writes are refused again, and
#      how many C wrote meanwhile) and the recovery (when each live member registered
#      again); asserted: the window closes by the first live member's re-acquire, that
#      re-acquire comes within the bound the design claims (invariant 9: one device
#      check, 1 s, plus the recovery budget, TTL/4), no C write is accepted after it,
#      n1 and n2 stay members with their generations unchanged and their keys
#      registered, n3's key stays off; `fenced check --block-device` warns that the
#      device has no persistence.
# Host C is connected again with a 20-minute keep-alive timeout before anything
# starts: nvmet counts a write refused for a reservation conflict as no traffic, so
# with the default 5 s keep-alive it deletes the controller of a fenced host that keeps
# writing (fence-nvme/README.md) and C's writer would write nothing during the window.
# Over TCP or RDMA such a host reconnects by itself; the loop transport does not, so the
# long timeout stands in for that: C stays the worst case, a fenced host that can
# still reach the target and still writes.
# Lease TTL 15 s: the emulated guest on a loaded host missed renewals at 5 and 10 s.
# Run from the host with fenced/scenarios/run-guest-target-reset.sh. Prints a timeline.
set -u
A=${HWTEST_NVME_HOSTS%%,*}; rest=${HWTEST_NVME_HOSTS#*,}; B=${rest%%,*}; C=${rest#*,}
EP=http://127.0.0.1:2379
ROOT=/reset
TTL=15
# The bound invariant 9 claims for the window: a live member's device check (every
# second) finds the lost state, and its registration and acquire complete within the
# recovery budget it keeps on its lease (TTL/4, agent/lost_state.rs).
BOUND=$(awk "BEGIN{print 1 + $TTL / 4}")
export FENCED_CONNECT_TIMEOUT_SECS=30
E="--etcd-endpoints $EP --root $ROOT"
SUBNQN=nqn.2014-08.org.fenced:hwtest
NS=/sys/kernel/config/nvmet/subsystems/$SUBNQN/namespaces/1
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "reset[$(t)s]: $*"; }
die() { say "FAIL: $*"; ls -l /dev/nvme*; report "$A"; for f in /tmp/n1.log /tmp/n2.log /tmp/n3.log /tmp/wA.log /tmp/wC.log; do echo "--- $f"; tail -n 25 "$f"; done; dmesg | grep -a -E 'nvme|nvmet' | tail -n 15; exit 1; }
until_() {
  lim=$1; what=$2; shift 2; start=$(t)
  until "$@"; do
    awk "BEGIN{exit !($(t) - $start > $lim)}" && die "timed out after ${lim}s waiting for $what"
    sleep 0.2
  done
}
# `fenced status` costs 10-15 s in the emulated guest: read it once per checkpoint
# (snap) and take the rows from that copy.
snap() { fenced status $E >/tmp/status.txt 2>&1 || die "fenced status failed: $(cat /tmp/status.txt)"; }
gen_of() { awk -v n="$1" 'NR > 2 && $1 == n {print $3}' /tmp/status.txt; }
members() { awk 'NR > 2 && $2 == "yes" {printf "%s ", $1}' /tmp/status.txt; }
report() { nvme resv-report "$1" --eds 2>/dev/null || nvme-resv report "$1" 2>/dev/null; }
key_of() { nvme-resv key-for-node "$1" 2>/dev/null; }
# The guest's wall clock against its uptime, to place fenced's log lines (UTC, RFC
# 3339) on the writers' timeline: wait for a second to turn, then EPOCH0 is the wall
# clock at uptime 0.
s0=$(date +%s); while [ "$(date +%s)" = "$s0" ]; do :; done
EPOCH0=$(awk -v s=$((s0 + 1)) -v u="$(t)" 'BEGIN{printf "%.2f", s - u}')
# at_uptime LINE: the uptime at which fenced logged LINE (its leading timestamp).
at_uptime() {
  ts=${1%% *}; whole=${ts%%.*}; frac=${ts#*.}; frac=${frac%Z}
  e=$(date -u -d "$(echo "$whole" | tr T ' ')" +%s) || return 1
  awk -v e="$e" -v f="0.$frac" -v z="$EPOCH0" 'BEGIN{printf "%.2f", e + f - z}'
}
# writer DEV LOG: one O_DIRECT 4 KiB write after another, each logged with the guest's
# uptime when it returned: "T ok", "T refused" (EBADE, "Invalid exchange") or
# "T error MESSAGE".
writer() {
  i=0
  # Its own file for dd's messages ($$ is the scenario's PID in every writer).
  err=/tmp/dd.${2##*/}
  while :; do
    # Never create a regular file in /dev: a namespace that went away is an error.
    if [ ! -b "$1" ]; then echo "$(t) error $1 is not a block device"; sleep 0.2; i=$((i + 1)); continue; fi
    if dd if=/dev/zero of="$1" bs=4096 count=1 seek=$((i % 64 + 512)) oflag=direct conv=notrunc 2>"$err" >/dev/null; then
      echo "$(t) ok"
    elif grep -q "Invalid exchange" "$err"; then
      echo "$(t) refused"
    else
      echo "$(t) error $(grep -v 'records' "$err" | head -n 1)"
    fi
    i=$((i + 1))
  done >"$2"
}
# first_after LOG T WHAT: the time of the first WHAT line after T (empty if none).
first_after() { awk -v t0="$2" -v w="$3" '$1 > t0 && $2 == w {print $1; exit}' "$1"; }
last_before() { awk -v t0="$2" '$1 <= t0 {l = $2} END {print l}' "$1"; }
count_between() { awk -v a="$2" -v b="$3" -v w="$4" '$1 > a && $1 <= b && $2 == w' "$1" | wc -l; }
ns_dev() { # controller nsid -> /dev/... of that namespace on that controller
  for d in /sys/class/nvme/$1/$1n*; do
    [ -e "$d" ] || continue
    [ "$(cat "$d/nsid" 2>/dev/null)" = "$2" ] && { echo "/dev/${d##*/}"; return 0; }
  done
  return 1
}

say "hosts: A=$A B=$B C=$C (guest wall clock at uptime 0: $EPOCH0)"
# Host C again, with keep_alive_tmo=1200 (see the header): same host NQN and host ID.
CC=$HWTEST_HOST_C_CTRL
echo 1 >"/sys/class/nvme/$CC/delete_controller" || die "deleting host C's controller $CC failed"
gone() { [ ! -e "/sys/class/nvme/$CC" ]; }
until_ 30 "host C's controller $CC to go" gone
exec 3<>/dev/nvme-fabrics || die "open /dev/nvme-fabrics"
printf 'transport=loop,nqn=%s,hostnqn=%s,hostid=%s,keep_alive_tmo=1200' "$SUBNQN" "$HWTEST_HOST_C_NQN" "$HWTEST_HOST_C_ID" >&3 \
  || die "connecting host C again with keep_alive_tmo=1200 failed"
read -r line <&3
exec 3>&-
CC=""
for c in /sys/class/nvme/nvme*; do
  [ "$(cat "$c/hostnqn" 2>/dev/null)" = "$HWTEST_HOST_C_NQN" ] && CC=${c##*/}
done
[ -n "$CC" ] || die "no controller for host C after reconnecting ($line)"
cdev() { C=$(ns_dev "$CC" 1) && [ -b "$C" ]; }
until_ 30 "namespace 1 on host C's new controller $CC" cdev
say "host C connected again: $line -> $CC -> $C, kato $(cat /sys/class/nvme/$CC/kato 2>/dev/null || echo '?') s"
# No namespace-change notices to the hosts (Set Features, Asynchronous Event
# Configuration 0): a target that restarts or fails over comes back with the same
# namespace, which a reconnecting host keeps under the same block device. Told that
# namespace 1 changed, a host rescans, and a rescan that lands while the namespace is
# disabled removes it and adds it back under a new name (nvme0n2 -> nvme0n3, seen
# here); the daemons hold the old device and their device checks then fail until the
# lease decides (not what this scenario measures).
for c in "$HWTEST_HOST_A_CTRL" "$HWTEST_HOST_B_CTRL" "$CC"; do
  nvme set-feature "/dev/$c" --feature-id=0x0b --value=0 >/dev/null \
    || die "turning off the asynchronous event notices of $c failed"
done

mkdir -p /tmp/etcd
etcd --name g1 --data-dir /tmp/etcd/data --listen-client-urls $EP --advertise-client-urls $EP \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster g1=http://127.0.0.1:2380 >/tmp/etcd.log 2>&1 &
ETCD=$!
healthy() { wget -qO- $EP/health 2>/dev/null | grep -q true; }
until_ 60 "etcd health" healthy
say "what the device reports (nvme-resv capabilities):"
nvme-resv capabilities "$A" | grep -iE 'persist|reservation types|ONCS' || die "nvme-resv capabilities failed"
n=1
for dev in $A $B $C; do
  fenced run --node-id n$n --instance-id guest-n$n --block-device "$dev" --fencer nvme \
    --etcd-endpoints $EP --root $ROOT --ttl-secs $TTL --sweep-secs 3 --claim-ttl-secs 30 \
    --preempt preempt --seed-arenas a1,a2,a3 --arenas 1 --pid-file /tmp/n$n.pid --metrics-listen 127.0.0.1:910$n >/tmp/n$n.log 2>&1 &
  eval "PID$n=$!"
  n=$((n + 1))
done
running3() { [ "$(grep -l "fenced running" /tmp/n1.log /tmp/n2.log /tmp/n3.log | wc -l)" = 3 ]; }
until_ 400 "three daemons running" running3
snap
say "three members: $(members)"
[ "$(members | wc -w)" = 3 ] || die "not three members: $(cat /tmp/status.txt)"
report "$A"
writer "$A" /tmp/wA.log &
WA=$!
writer "$C" /tmp/wC.log &
WC=$!
okC() { grep -q ' ok$' /tmp/wC.log; }
until_ 60 "C's first write" okC
say "writers on A (n1) and C (n3) running: C's writes accepted before the fence"

G3=$(gen_of n3)
[ -n "$G3" ] || die "no generation for n3 in fenced status: $(cat /tmp/status.txt)"
TS=$(t)
say "SIGSTOP n3 (pid $PID3)"
kill -STOP "$PID3"
fenced_n3() { grep -q '"node":"n3".*"fencer_result":"confirmed"' /tmp/n1.log /tmp/n2.log; }
until_ 240 "n3's fence" fenced_n3
refusedC() { [ -n "$(first_after /tmp/wC.log "$TS" refused)" ]; }
until_ 60 "C's writes refused after the fence" refusedC
say "n3 fenced; C's writes refused from $(first_after /tmp/wC.log "$TS" refused)s"
kill -CONT "$PID3"
wait "$PID3"; rc3=$?
[ $rc3 = 3 ] || die "n3 did not self-fence (exit $rc3)"
say "n3's daemon self-fenced (exit 3); C's writer keeps trying"
sleep 2
[ "$(last_before /tmp/wC.log "$(t)")" = refused ] || die "C's writes are not refused before the reset"
report "$A"
K1=$(key_of n1); K2=$(key_of n2); K3=$(key_of n3)
snap
G1=$(gen_of n1); G2=$(gen_of n2)
say "n3's generation $G3 -> $(gen_of n3); n1's $G1, n2's $G2; members: $(members)"
[ "$(gen_of n3)" = $((G3 + 1)) ] || die "n3's generation did not move by one"

# Still there (nvmet deletes a fenced host's controller when its keep-alive runs out).
[ -e "/sys/class/nvme/$CC" ] && [ -b "$C" ] || die "host C's controller $CC is gone (nvmet's keep-alive?)"
say "RESET: namespace 1 disabled and enabled again (nvmet drops every registration and the reservation)"
T0=$(t)
echo 0 >"$NS/enable" || die "disabling namespace 1 failed"
echo 1 >"$NS/enable" || die "enabling namespace 1 failed"
T1=$(t)
say "namespace back at ${T1}s ($(awk "BEGIN{print $T1-$T0}")s)"
recovered2() { [ "$(grep -l "registered our key again" /tmp/n1.log /tmp/n2.log | wc -l)" = 2 ]; }
until_ 120 "both live members registered again" recovered2
sleep 3
TE=$(t)
# C's writes after the reset: accepted ones (the window), then refused again. A write
# issued before the state was lost may return "refused" just after the namespace is
# back: "refused again" is the first refusal after C's last accepted write.
LOKC=$(awk -v a="$T0" '$1 > a && $2 == "ok" {l = $1} END {print l}' /tmp/wC.log)
TR=$(first_after /tmp/wC.log "${LOKC:-$T1}" refused)
[ -n "$TR" ] || die "C's writes were not refused again after the reset"
[ -b "$C" ] && [ -b "$A" ] || die "the hosts' block devices did not survive the namespace restart"
grep -h "lost its reservation state" /tmp/n1.log /tmp/n2.log | cut -c1-200
# When each live member had registered again and held the reservation, on the
# writers' timeline.
RA1=$(at_uptime "$(grep -h "registered our key again" /tmp/n1.log | head -n 1)") || die "cannot place n1's recovery on the timeline"
RA2=$(at_uptime "$(grep -h "registered our key again" /tmp/n2.log | head -n 1)") || die "cannot place n2's recovery on the timeline"
RF=$(awk -v a="$RA1" -v b="$RA2" 'BEGIN{print (a < b) ? a : b}')
RL=$(awk -v a="$RA1" -v b="$RA2" 'BEGIN{print (a > b) ? a : b}')
NOK=$(count_between /tmp/wC.log "$T0" "$TR" ok)
TOK=$(first_after /tmp/wC.log "$T0" ok)
NERR=$(count_between /tmp/wC.log "$T0" "$TR" error)
RA=$(count_between /tmp/wA.log "$T0" "$TE" refused)
EA=$(count_between /tmp/wA.log "$T0" "$TE" error)
OKA=$(count_between /tmp/wA.log "$T0" "$TE" ok)
say "TIMELINE (guest uptime, s): reset $T0, namespace back $T1, first live re-acquire $RF (n1 $RA1, n2 $RA2), C refused again $TR"
say "WINDOW: C (fenced) wrote $NOK block(s) after the reset (first ${TOK:-none}, last ${LOKC:-none}; $NERR error(s)); refused again $(awk "BEGIN{printf \"%.2f\", $TR - $T1}")s after the namespace came back"
WIN=$(awk -v a="${TOK:-0}" -v b="${LOKC:-0}" 'BEGIN{printf "%.2f", b - a}')
[ -n "$TOK" ] && say "C's writes were accepted for ${WIN}s (from its first to its last accepted write)"
say "RECOVERY: first live member re-acquired $(awk "BEGIN{printf \"%.2f\", $RF - $T1}")s, both registered again $(awk "BEGIN{printf \"%.2f\", $RL - $T1}")s after the namespace came back (bound ${BOUND}s)"
say "A (n1, live) after the reset: $OKA ok, $RA refused, $EA error(s); $(count_between /tmp/wA.log "$T0" "$RF" ok) of the ok before the first re-acquire: with no persistence the kernel target lets every host write until a reservation is held again, the live and the fenced alike"
# The bound of invariant 9, and the window closed by the first re-acquire: no write of
# C's returned ok later than the re-acquire (a dd in flight then may complete just
# after it: 0.5 s of slack for the writer's own clock read).
awk "BEGIN{exit !($RF - $T1 <= $BOUND)}" || die "the first live member re-acquired $(awk "BEGIN{print $RF - $T1}")s after the namespace came back: more than the ${BOUND}s the design claims"
[ -z "$LOKC" ] || awk "BEGIN{exit !($LOKC <= $RF + 0.5)}" || die "C (fenced) wrote at ${LOKC}s, after the first live member re-acquired at ${RF}s"
[ "$(count_between /tmp/wC.log "$TR" "$TE" ok)" = 0 ] || die "C's writes were accepted again after they were refused again"
[ "$(last_before /tmp/wC.log "$TE")" = refused ] || die "C's writes are not refused after the recovery"
snap
say "members now: $(members); generations n1 $(gen_of n1) (was $G1), n2 $(gen_of n2) (was $G2)"
[ "$(members | wc -w)" = 2 ] || die "the live members did not stay members"
[ "$(gen_of n1)" = "$G1" ] && [ "$(gen_of n2)" = "$G2" ] || die "a live member's generation moved"
R=$(report "$A")
echo "$R"
echo "$R" | grep -q "${K1#0x}" && echo "$R" | grep -q "${K2#0x}" || die "a live member's key is not registered again"
echo "$R" | grep -q "${K3#0x}" && die "the fenced node's key is registered again"
[ "$(last_before /tmp/wA.log "$TE")" = ok ] || die "A's writes do not go on after the recovery"
for m in 1 2; do
  c=$(wget -qO- http://127.0.0.1:910$m/metrics 2>/dev/null | grep '^fenced_lost_state_recoveries_total' | tr '\n' ' ')
  say "n$m: ${c:-fenced_lost_state_recoveries_total absent}"
done
fenced check $E --block-device "$A" >/tmp/check.log 2>&1; rcc=$?
grep -i "persist" /tmp/check.log || die "fenced check --block-device says nothing about persistence"
say "fenced check exit status $rcc"
cat /tmp/status.txt
grep -q "^namespace: .*persist through power loss: NOT supported" /tmp/status.txt \
  || die "fenced status does not show the namespace's persistence"
say "PASS: the target lost its reservation state; the fenced host wrote $NOK block(s) in a window of $(awk "BEGIN{printf \"%.2f\", $TR - $T1}")s and was refused again once the first live member re-acquired ($(awk "BEGIN{printf \"%.2f\", $RF - $T1}")s, bound ${BOUND}s); n1 and n2 stayed members with unchanged generations"
kill $WA $WC 2>/dev/null
kill "$PID1" "$PID2" 2>/dev/null; wait "$PID1" "$PID2" 2>/dev/null
kill "$ETCD"; wait "$ETCD" 2>/dev/null
exit 0
