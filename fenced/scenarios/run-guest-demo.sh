#!/usr/bin/env bash
# The README's main-job demo, one command: builds `fenced`, boots the hwtests guest
# (kernel nvmet target, one reservation-capable namespace, three loop hosts) and runs
# fenced/scenarios/guest-fence.sh in it with etcd and three fenced daemons (a fourth
# joins for the last phase, a device that refuses every preempt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/fenced-target}
command -v etcd >/dev/null || apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 etcd-server
(cd "$repo" && cargo build -p fenced --bin fenced)
stage=${HWTEST_GUEST_CACHE:-/var/tmp/fenced-guest-cache}/fenced-demo
mkdir -p "$stage"
cp "$CARGO_TARGET_DIR/debug/fenced" "$stage/fenced"
strip "$stage/fenced" 2>/dev/null || true
exec "$repo/hwtests/guest/run" --scenario "$here/guest-fence.sh" \
  --add "$(command -v etcd)=/usr/local/bin/etcd" --add "$stage/fenced=/usr/local/bin/fenced" "$@"
