#!/usr/bin/env bash
# Issue 14 section 2's guest test, one command: boots the hwtests guest with two
# reservation-capable namespaces (--resv-namespaces 2) and runs
# fenced/scenarios/guest-namespace.sh in it with etcd, etcdctl, fenced and nvme-resv.
set -euo pipefail
exec "$(dirname "$0")/run-guest-scenario.sh" guest-namespace.sh --resv-namespaces 2 "$@"
