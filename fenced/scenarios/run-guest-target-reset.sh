#!/usr/bin/env bash
# Issue 27 section 3 on the real kernel NVMe target, one command: builds `fenced`,
# boots the hwtests guest (kernel nvmet target with its default identifiers, one
# reservation-capable namespace, three loop hosts) and runs
# fenced/scenarios/guest-target-reset.sh in it with etcd and three fenced daemons: the
# target loses every registration and the reservation (a namespace restart, no
# persistence) while one host is fenced and its writer still runs. Prints the window
# until the fenced host's writes are refused again. Other arguments go to
# hwtests/guest/run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/fenced-target}
command -v etcd >/dev/null || apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 etcd-server
(cd "$repo" && cargo build -p fenced --bin fenced)
# A stage of its own: another scenario's run may replace its binaries meanwhile.
# Three daemons and two writers in an emulated CPU: allow the guest more time.
export HWTEST_GUEST_TIMEOUT=${HWTEST_GUEST_TIMEOUT:-1200}
stage=${HWTEST_GUEST_CACHE:-/var/tmp/fenced-guest-cache}/fenced-target-reset
mkdir -p "$stage"
cp "$CARGO_TARGET_DIR/debug/fenced" "$stage/fenced"
strip "$stage/fenced" 2>/dev/null || true
exec "$repo/hwtests/guest/run" --scenario "$here/guest-target-reset.sh" --ns-ids default \
  --add "$(command -v etcd)=/usr/local/bin/etcd" --add "$stage/fenced=/usr/local/bin/fenced" "$@"
