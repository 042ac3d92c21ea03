#!/bin/busybox sh
# Scenario for hwtests/guest/test-kernel-fallback: shows, with nvme-cli and busybox
# alone (no cargo build), that the booted kernel's nvmet enforces reservations. Host A
# registers and holds Write Exclusive; unregistered host B's O_DIRECT write is refused
# (EBADE); A's write goes through; the report names A's key as the holder's.
say() { echo "smoke: $*"; }
fail() { say "FAIL: $*"; exit 1; }
A=${HWTEST_NVME_HOSTS%%,*}
rest=${HWTEST_NVME_HOSTS#*,}
B=${rest%%,*}
say "kernel $(uname -r); host A $A, host B $B"
nvme resv-register "$A" --nrkey=0xaaaa --rrega=0 || fail "A: register 0xaaaa"
nvme resv-acquire "$A" --crkey=0xaaaa --rtype=1 --racqa=0 || fail "A: acquire Write Exclusive"
if dd if=/dev/zero of="$B" bs=4096 count=1 oflag=direct 2>/tmp/b.err; then
  fail "unregistered B wrote through A's Write Exclusive reservation"
fi
grep -q 'Invalid exchange' /tmp/b.err || fail "B's write failed, but not with EBADE: $(cat /tmp/b.err)"
say "B's write refused: $(tr '\n' ' ' </tmp/b.err)"
dd if=/dev/zero of="$A" bs=4096 count=1 oflag=direct 2>/tmp/a.err || fail "holder A cannot write: $(cat /tmp/a.err)"
nvme resv-report "$A" --eds -o json >/tmp/r.json || fail "A: resv-report --eds"
report=$(tr -d ' \n\t' </tmp/r.json)
say "report: $report"
case $report in
  *'"rtype":1'*'"rkey":43690'*) say "PASS: A (0xaaaa) holds Write Exclusive, B is refused" ;;
  *) fail "report does not show A's key 0xaaaa holding rtype 1" ;;
esac
