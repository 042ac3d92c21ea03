#!/bin/busybox sh
# Default scenario of hwtests/guest/run: an nvme-cli smoke check of the target, then
# every hwtests test binary, ignored tests included, one test at a time (they share the
# namespace's reservation state). Exit status 0 only if everything passed.
uptime_s() { cut -d' ' -f1 /proc/uptime; }
say() { echo "hwtests: $*"; }
rc=0

A=${HWTEST_NVME_HOSTS%%,*}
say "smoke: nvme-cli sees reservations on $A"
if nvme id-ctrl "$A" -o json | grep -q '"oncs"' \
  && nvme resv-report "$A" --eds -o json >/tmp/smoke.json; then
  say "smoke: resv-report --eds ok: $(tr -d '\n ' </tmp/smoke.json)"
else
  say "smoke: FAIL (nvme-cli cannot reach the namespace)"
  rc=1
fi

start=$(uptime_s)
for t in /hwtests/bin/*; do
  [ -x "$t" ] || continue
  name=${t##*/}
  say "running $name"
  t0=$(uptime_s)
  if [ -n "${HWTEST_FILTER:-}" ]; then
    "$t" --include-ignored --test-threads=1 --nocapture "$HWTEST_FILTER"
  else
    "$t" --include-ignored --test-threads=1 --nocapture
  fi
  r=$?
  say "$name took $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }')s: $([ $r = 0 ] && echo PASS || echo "FAIL (exit $r)")"
  [ $r = 0 ] || rc=1
done
say "summary: all test binaries took $(awk -v a="$start" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }')s, $([ $rc = 0 ] && echo PASS || echo FAIL)"
exit $rc
