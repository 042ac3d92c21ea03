#!/usr/bin/env bash
# Runs one of fenced's guest scenarios (fenced/scenarios/guest-*.sh) in the hwtests
# guest: builds `fenced`, adds it with etcd and etcdctl, boots the kernel nvmet target
# (one reservation-capable namespace, three loop hosts) and passes any further
# arguments to hwtests/guest/run (e.g. --resv-namespaces 2, --verbose).
#
#   fenced/scenarios/run-guest-scenario.sh guest-attest.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
scenario=${1:?usage: run-guest-scenario.sh SCENARIO.sh [hwtests/guest/run options]}
shift
[[ -f $scenario ]] || scenario=$here/$scenario
[[ -f $scenario ]] || { echo "run-guest-scenario: no scenario $scenario" >&2; exit 2; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/fenced-target}
command -v etcd >/dev/null || apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 etcd-server etcd-client
(cd "$repo" && cargo build -p fenced --bin fenced)
stage=${HWTEST_GUEST_CACHE:-/var/tmp/fenced-guest-cache}/fenced-scenario
mkdir -p "$stage"
cp "$CARGO_TARGET_DIR/debug/fenced" "$stage/fenced"
strip "$stage/fenced" 2>/dev/null || true
exec "$repo/hwtests/guest/run" --scenario "$scenario" \
  --add "$(command -v etcd)=/usr/local/bin/etcd" \
  --add "$(command -v etcdctl)=/usr/local/bin/etcdctl" \
  --add "$stage/fenced=/usr/local/bin/fenced" "$@"
