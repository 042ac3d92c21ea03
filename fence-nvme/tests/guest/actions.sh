#!/bin/sh
# Drives fence-nvme/tests/data/actions.tsv (the action/exit-code table, after
# fence-agents' tests/actions.d) on the guest's kernel target: busybox sh, run by
# fence-nvme.sh with the table's path once nobody is registered on the namespaces.
# Needs A1 A3 B1 B3 C1 C3 (the hosts' paths to nsid 1 and 3) in the environment.
set -u
table=$1
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "actions[$(t)s]: $*"; }
devs_of() { case $1 in A) echo "$A1,$A3" ;; B) echo "$B1,$B3" ;; C) echo "$C1,$C3" ;; esac; }
n=0; failed=0
while read -r name caller action node expect what; do
  case $name in ''|'#'*) continue ;; esac
  n=$((n + 1))
  devs=$(devs_of "$caller")
  [ -n "$devs" ] || { say "FAIL: line $n ($name): unknown caller '$caller'"; failed=$((failed + 1)); continue; }
  {
    [ "$node" = - ] || printf 'nodename=%s\n' "$node"
    printf 'action=%s\n' "$action"
    [ "$node" = - ] || printf 'port=%s\n' "$node"
    printf 'devices=%s\nstate_file=/tmp/actions-state.%s\n' "$devs" "$caller"
  } | fence_nvme >/tmp/action.out 2>&1
  rc=$?
  if echo "$rc" | grep -Eq -- "$expect"; then
    say "ok   $name: $caller $action $node -> $rc ($expect): $what"
  else
    say "FAIL $name: $caller $action $node -> $rc, expected $expect: $what"
    sed 's/^/    /' /tmp/action.out
    failed=$((failed + 1))
  fi
done <"$table"
[ "$n" -gt 0 ] || { say "FAIL: no rows in $table"; exit 1; }
say "$n rows, $failed failed"
[ "$failed" = 0 ]
