#!/usr/bin/env bash
# Preempt-then-verify latency in the hwtests guest (real nvmet namespace, 3 loop hosts):
# the nvme-resv library vs nvme-cli (two processes) vs the raw two-ioctl floor, one run,
# interleaved. Builds the static `guest_preempt` binary (release) and runs it in the
# guest through hwtests/guest/run --scenario. Prints the BENCH lines.
#
#   benches/scripts/guest-preempt.sh               # 200 iterations per action
#   PREEMPT_ITERS=50 benches/scripts/guest-preempt.sh
#
# Needs what hwtests/guest/run needs (root for packages and mknod, qemu, ~2-4 min under TCG).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/fenced-target}
triple=x86_64-unknown-linux-gnu
iters=${PREEMPT_ITERS:-200}
cli_every=${PREEMPT_CLI_EVERY:-4}

(cd "$repo" && RUSTFLAGS='-C target-feature=+crt-static' \
  cargo build -q --release -p benches --bin guest_preempt --target "$triple")
bin=$CARGO_TARGET_DIR/$triple/release/guest_preempt
[[ -x $bin ]] || { echo "guest-preempt: $bin not built" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/scenario.sh" <<'SCEN'
#!/bin/sh
# Runs in the guest (busybox sh).
echo "guest-preempt: hosts $HWTEST_NVME_HOSTS, nvme-cli $(nvme version 2>/dev/null | head -n1)"
guest_preempt || exit 1
SCEN
log=$work/guest.log
set +e
"$repo/hwtests/guest/run" --no-cli --scenario "$work/scenario.sh" --add "$bin" \
  --env "PREEMPT_ITERS=$iters" --env "PREEMPT_CLI_EVERY=$cli_every" -v >"$log" 2>&1
rc=$?
set -e
grep -a -E '^(guest_preempt|guest-preempt|BENCH)' "$log" | tr -d '\r'
if ((rc != 0)); then
  tail -n 60 "$log" >&2
  echo "guest-preempt: guest run failed (rc $rc)" >&2
  exit "$rc"
fi
