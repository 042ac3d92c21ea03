#!/usr/bin/env bash
# Issue 14 parts 1 and 4 on the real kernel NVMe target: builds `fenced`, boots the
# hwtests guest and runs fenced/scenarios/guest-restart.sh in it (etcd, etcdctl and
# three fenced daemons): a fenced node's restart on the same boot is refused, unfence
# and a new boot id let it join, and leave unregisters before it returns anything.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/fenced-target}
command -v etcd >/dev/null || apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 etcd-server
command -v etcdctl >/dev/null || apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600 etcd-client
(cd "$repo" && cargo build -p fenced --bin fenced --example app_writer)
stage=${HWTEST_GUEST_CACHE:-/var/tmp/fenced-guest-cache}/fenced-restart
mkdir -p "$stage"
cp "$CARGO_TARGET_DIR/debug/fenced" "$stage/fenced"
cp "$CARGO_TARGET_DIR/debug/examples/app_writer" "$stage/app_writer"
strip "$stage/fenced" "$stage/app_writer" 2>/dev/null || true
exec "$repo/hwtests/guest/run" --scenario "$here/guest-restart.sh" \
  --add "$(command -v etcd)=/usr/local/bin/etcd" --add "$(command -v etcdctl)=/usr/local/bin/etcdctl" \
  --add "$stage/fenced=/usr/local/bin/fenced" --add "$stage/app_writer=/usr/local/bin/app_writer" "$@"
