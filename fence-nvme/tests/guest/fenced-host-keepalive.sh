#!/bin/sh
# What Linux's NVMe target does to a fenced host that keeps writing (the cause of the
# cluster test's "writes succeed again after the fence", see fence-nvme/README.md).
# Run from the host:
#   hwtests/guest/run --scenario fence-nvme/tests/guest/fenced-host-keepalive.sh --no-cli
# Hosts A, B, C register; A holds Write Exclusive - All Registrants; B preempts and
# aborts A (which then writes every 0.5 s) and C (idle). Expected: A's writes fail with
# EBADE; within 30 s the target's traffic-based keep-alive expires for A (its refused
# writes do not count as traffic, while the host counts their completions and sends no
# Keep Alive) and, over the loop transport, A's controller is deleted; C keeps its
# controller; the reservation lists only B throughout.
set -u
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "keepalive[$(t)s]: $*"; }
fail() { say "FAIL: $*"; dmesg | grep -a -E 'keep-alive|fatal|Removing ctrl' | tail -n 5; exit 1; }
A=${HWTEST_NVME_HOSTS%%,*}; r=${HWTEST_NVME_HOSTS#*,}; B=${r%%,*}; C=${r#*,}
ctrl_of() { c=${1#/dev/}; echo "${c%n*}"; }
CA=$(ctrl_of "$A"); CC=$(ctrl_of "$C")
keys() { nvme resv-report "$B" -n 1 --eds 2>&1 | sed -n 's/^ *rkey *: *//p' | tr '\n' ' '; }
nvme resv-register "$A" -n 1 --nrkey=0xa --rrega=0 >/dev/null || fail "register A"
nvme resv-register "$B" -n 1 --nrkey=0xb --rrega=0 >/dev/null || fail "register B"
nvme resv-register "$C" -n 1 --nrkey=0xc --rrega=0 >/dev/null || fail "register C"
nvme resv-acquire "$A" -n 1 --crkey=0xa --rtype=5 --racqa=0 >/dev/null || fail "acquire A"
nvme resv-acquire "$B" -n 1 --crkey=0xb --prkey=0xa --rtype=5 --racqa=2 >/dev/null || fail "preempt A"
nvme resv-acquire "$B" -n 1 --crkey=0xb --prkey=0xc --rtype=5 --racqa=2 >/dev/null || fail "preempt C"
T0=$(t)
[ "$(keys)" = "b " ] || fail "after the preempts the report lists: $(keys)"
ebade=0 gone=""
while awk "BEGIN{exit !($(t) - $T0 < 30)}"; do
  if [ ! -e "/sys/class/nvme/$CA" ]; then gone=$(t); break; fi
  if dd if=/dev/zero of="$A" bs=4096 count=1 seek=100 oflag=direct conv=notrunc 2>/tmp/e; then
    fail "A wrote after its preempt"
  fi
  grep -q 'Invalid exchange' /tmp/e && ebade=$((ebade + 1))
  sleep 0.5
done
[ "$ebade" -gt 0 ] || fail "A's writes never failed with EBADE: $(cat /tmp/e)"
[ -n "$gone" ] || fail "A's controller $CA still there 30 s after its preempt (the target no longer drops it?)"
say "A: $ebade writes refused with EBADE, then its controller $CA deleted by the target $(awk "BEGIN{printf \"%.1f\", $gone - $T0}") s after the preempt"
dmesg | grep -a -E 'keep-alive timer|Removing ctrl' | tail -n 2
[ -e "/sys/class/nvme/$CC" ] || fail "the idle fenced host C lost its controller $CC too"
[ -f "$A" ] && fail "$A is a regular file"
[ "$(keys)" = "b " ] || fail "the report now lists: $(keys)"
say "C (fenced, idle) keeps $CC; the reservation still lists only B"
say "PASS"
