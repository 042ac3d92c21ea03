#!/usr/bin/env bash
# Issue 14 parts 1 and 4 on the real kernel NVMe target, one command: builds the
# example application (fenced/examples/app_writer.rs) and runs
# fenced/scenarios/guest-restart.sh on the shared scenario runner (etcd, etcdctl,
# fenced): a fenced node's restart on the same boot is refused, unfence and a new boot
# id let it join, and leave unregisters before it returns anything.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/fenced-target}
(cd "$repo" && cargo build -p fenced --example app_writer)
stage=${HWTEST_GUEST_CACHE:-/var/tmp/fenced-guest-cache}/fenced-restart
mkdir -p "$stage"
cp "$CARGO_TARGET_DIR/debug/examples/app_writer" "$stage/app_writer"
strip "$stage/app_writer" 2>/dev/null || true
exec "$here/run-guest-scenario.sh" guest-restart.sh \
  --add "$stage/app_writer=/usr/local/bin/app_writer" "$@"
