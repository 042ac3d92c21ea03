#!/bin/sh
# fence_nvme in the hwtests guest (busybox sh), on the kernel NVMe target: two
# reservation-capable namespaces (nsid 1 and 3) shared by three loop hosts A, B, C, and
# nsid 2 without reservations. Run from the host with fence-nvme/tests/guest/run.
#
# Every agent call is made the way Pacemaker's fencer makes it: no arguments, the
# parameters as key=value lines on standard input (the lines pacemaker-fenced 2.1.5
# sends: nodename, action, port, then the device's parameters). Node names: na, nb, nc.
#   1. `on` for each host: every key on both namespaces, one WE-AR reservation; monitor
#      (and its refusal of the namespace without reservations), list
#   2. `off` of nc from A: both namespaces sever C (O_DIRECT write fails EBADE, nvme-cli's
#      report shows the key gone), `status` says off, the watchdog check on C fails
#   3. `off` of A itself from A: refused, nothing changed
#   4. idempotent second `off` of nc (from B, through its /dev/ng* char devices)
#   5. a device that refuses: A's registration on nsid 3 moved to host C (same key),
#      so the device answers A's preempt with Reservation Conflict: exit 1 naming it;
#      the namespace without reservations in devices: exit 1 naming it; fixed, the
#      retry completes
#   6. the reservation released (issue 26): B and C unfenced again, the holder A releases
#      it on both namespaces (every host still registered, nvme-cli reports rtype 0, C
#      writes); `off` of nc acquires the reservation before the preempt and C's next
#      O_DIRECT write fails EBADE (before the fix: "Success" while C kept writing)
#   7. the action/exit-code table (../data/actions.tsv, after fence-agents' actions.d),
#      on namespaces nobody is registered on any more
#   8. the watchdog companions: fence_nvme_check on C (fenced in 2 and 6) exits 2;
#      fence_nvme_check_hardreboot exits 0 on a registered node and 1 on an unreadable
#      device without rebooting, then on C reboots the guest at once (run with
#      --expect-restart: the harness passes on the kernel's restart after the
#      HWTEST-GUEST-EXPECT-RESTART line, and this script's last line is never reached)
set -u
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "fence-nvme[$(t)s]: $*"; }
fail() { say "FAIL: $*"; exit 1; }

A1=${HWTEST_NVME_HOSTS%%,*}; r=${HWTEST_NVME_HOSTS#*,}; B1=${r%%,*}; C1=${r#*,}
[ -n "${HWTEST_NVME_HOSTS2:-}" ] || fail "HWTEST_NVME_HOSTS2 unset: run the guest with --resv-namespaces 2"
A3=${HWTEST_NVME_HOSTS2%%,*}; r=${HWTEST_NVME_HOSTS2#*,}; B3=${r%%,*}; C3=${r#*,}
NORESV=$HWTEST_NVME_NORESV
# Host B names its namespaces by their generic character devices.
NGB1=/dev/ng${B1#/dev/nvme}; NGB3=/dev/ng${B3#/dev/nvme}
[ -c "$NGB1" ] && [ -c "$NGB3" ] || fail "no generic char devices $NGB1 $NGB3"
say "nsid 1: A=$A1 B=$B1 ($NGB1) C=$C1; nsid 3: A=$A3 B=$B3 ($NGB3) C=$C3; no reservations: $NORESV"

devs_of() { case $1 in A) echo "$A1,$A3" ;; B) echo "$NGB1,$NGB3" ;; C) echo "$C1,$C3" ;; esac; }
# agent HOST ACTION NODE [DEVICES]: runs fence_nvme as HOST's fencer would; output in
# /tmp/out, exit status in $rc.
agent() {
  devs=${4:-$(devs_of "$1")}
  printf 'nodename=%s\naction=%s\nport=%s\ndevices=%s\nstate_file=/tmp/state.%s\n' \
    "$3" "$2" "$3" "$devs" "$1" | fence_nvme >/tmp/out 2>&1
  rc=$?
  sed "s/^/    [$1 $2 $3 rc=$rc] /" /tmp/out
}
expect_rc() { [ "$rc" = "$1" ] || fail "$2: exit $rc, expected $1"; }
expect_out() { grep -q -- "$1" /tmp/out || fail "$2: output lacks '$1'"; }
key_of() { nvme-resv key-for-node "$1"; }
hexkey() { k=$(key_of "$1"); echo "${k#0x}"; }
# nvme-cli, the independent peer, prints each registrant as "rkey : <hex>".
keys_on() { nvme resv-report "$1" --eds 2>/dev/null | sed -n 's/^ *rkey *: *//p' | tr '\n' ' '; }
has_key() { keys_on "$1" | grep -q -w "$(hexkey "$2")"; }
rtype_on() { nvme resv-report "$1" --eds 2>/dev/null | sed -n 's/^rtype *: *//p'; }
# O_DIRECT 4 KiB write at 1 MiB; output in /tmp/dd.
write_direct() { dd if=/dev/zero of="$1" bs=4096 count=1 seek=256 oflag=direct >/tmp/dd 2>&1; }

say "--- 1. on for each host"
for h in A B C; do
  n=n$(echo $h | tr ABC abc)
  agent $h on $n
  expect_rc 0 "on $n"
  expect_out "Success: Powered ON" "on $n"
done
for d in $A1 $A3; do
  for n in na nb nc; do has_key "$d" $n || fail "$n's key missing on $d after on: $(keys_on "$d")"; done
  [ "$(rtype_on "$d")" = 5 ] || fail "$d holds rtype '$(rtype_on "$d")', expected 5 (WE-AR)"
done
say "reports: $A1: $(keys_on $A1)/ rtype $(rtype_on $A1); $A3: $(keys_on $A3)/ rtype $(rtype_on $A3)"
for d in $C1 $C3; do write_direct "$d" || fail "C cannot write $d before the fence: $(cat /tmp/dd)"; done
# monitor (the lines pacemaker-fenced sends for it: action and the parameters) and list.
printf 'action=monitor\nverbose=1\ndevices=%s,%s\n' "$A1" "$A3" | fence_nvme >/tmp/out 2>&1 || fail "monitor: $(cat /tmp/out)"
printf 'action=monitor\ndevices=%s,%s\n' "$A1" "$NORESV" | fence_nvme >/tmp/out 2>&1 && fail "monitor accepted $NORESV"
grep -q "1 of 2 device(s) unusable: $NORESV" /tmp/out || fail "monitor did not name $NORESV: $(cat /tmp/out)"
agent A list x
expect_rc 0 "list"
expect_out "^$(key_of nc),$A3\$" "list"
agent A status nc
expect_rc 0 "status nc before the fence"
expect_out "Status: ON" "status nc before the fence"
fence_nvme_check --state-file /tmp/state.C || fail "check on C failed before the fence"

say "--- 2. off of nc from A"
T0=$(t)
agent A off nc
expect_rc 0 "off nc"
expect_out "Success: Powered OFF" "off nc"
[ "$(grep -c 'removed by preempt-and-abort' /tmp/out)" = 2 ] || fail "off nc: not both devices severed"
say "off took $(awk "BEGIN{print $(t)-$T0}")s"
for d in $C1 $C3; do
  if write_direct "$d"; then fail "C still writes $d after the fence"; fi
  grep -q "Invalid exchange" /tmp/dd || fail "C's write to $d failed, but not with EBADE: $(cat /tmp/dd)"
  say "C's O_DIRECT write to $d: $(tr '\n' ' ' </tmp/dd)"
done
for d in $A1 $A3; do
  has_key "$d" nc && fail "nc's key still on $d: $(keys_on "$d")"
  has_key "$d" na && has_key "$d" nb || fail "survivors' keys missing on $d: $(keys_on "$d")"
  write_direct "$d" || fail "A cannot write $d after fencing C: $(cat /tmp/dd)"
done
say "reports: $A1: $(keys_on $A1); $A3: $(keys_on $A3)"
agent B status nc
expect_rc 2 "status nc after the fence"
expect_out "Status: OFF" "status nc after the fence"
fence_nvme_check --state-file /tmp/state.C 2>/tmp/check; crc=$?
sed 's/^/    [check C] /' /tmp/check
[ $crc = 2 ] || fail "fence_nvme_check on C: exit $crc, expected 2"
grep -q "$C1" /tmp/check && grep -q "$C3" /tmp/check || fail "check on C does not name both devices"
fence_nvme_check --state-file /tmp/state.A || fail "fence_nvme_check on A (not fenced) failed"

say "--- 3. off of A from A itself"
agent A off na
expect_rc 1 "off of itself"
expect_out "refusing to fence node na" "off of itself"
for d in $A1 $A3; do has_key "$d" na || fail "A's key gone from $d after a refused self-fence"; done

say "--- 4. second off of nc (from B, through $NGB1,$NGB3)"
agent B off nc
expect_rc 0 "second off nc"
[ "$(grep -c 'already absent' /tmp/out)" = 2 ] || fail "second off: not 'already absent' on both devices"

say "--- 5. a device that refuses"
# A's registration on nsid 3 moves to host C under A's key: A's own check passes (the key
# is in the report), the device refuses A's preempt (host A is not a registrant).
nvme-resv register "$A3" --rrega unregister --crkey "$(key_of na)" >/dev/null || fail "unregister A on $A3"
nvme-resv register "$C3" --nrkey "$(key_of na)" >/dev/null || fail "register na's key from host C on $A3"
agent A off nb
expect_rc 1 "off nb with a refusing device"
expect_out "not confirmed on 1 of 2 device(s): $A3" "off nb with a refusing device"
expect_out "$A3: key $(key_of nb) is still registered after preempt-and-abort (the device answered: .*Reservation Conflict" "off nb with a refusing device"
has_key "$A1" nb && fail "nb's key still on $A1: the answering device should have been severed"
has_key "$A3" nb || fail "nb's key gone from $A3 although the device refused"
agent A status nb
expect_rc 0 "status nb while one device still has it"
# The namespace without reservations, listed as a device.
agent A off nb "$A1,$NORESV"
expect_rc 1 "off nb with a namespace without reservations"
expect_out "not confirmed on 1 of 2 device(s): $NORESV" "off nb with a namespace without reservations"
expect_out "does not support reservations" "off nb with a namespace without reservations"
# Fixed: host C gives back A's key, A registers again (unfencing), the retry completes.
nvme-resv register "$C3" --rrega unregister --crkey "$(key_of na)" >/dev/null || fail "unregister na from host C"
agent A on na
expect_rc 0 "on na again"
agent A off nb
expect_rc 0 "off nb retried"
expect_out "$A1: key $(key_of nb) already absent" "off nb retried"
expect_out "$A3: key $(key_of nb) removed by preempt-and-abort" "off nb retried"
for d in $A1 $A3; do
  has_key "$d" nb && fail "nb's key still on $d after the retry"
  has_key "$d" na || fail "A's key missing on $d"
done
agent A status nb
expect_rc 2 "status nb after the retry"

say "--- 6. off with the reservation released (both hosts still registered)"
agent B on nb
expect_rc 0 "on nb again"
agent C on nc
expect_rc 0 "on nc again"
for d in $A1 $A3; do
  nvme-resv release "$d" --crkey "$(key_of na)" --rtype 5 >/dev/null || fail "release on $d"
  [ "$(rtype_on "$d")" = 0 ] || fail "$d still holds rtype '$(rtype_on "$d")' after the release"
  for n in na nb nc; do has_key "$d" $n || fail "$n's key missing on $d after the release: $(keys_on "$d")"; done
done
for d in $C1 $C3; do write_direct "$d" || fail "C cannot write $d with no reservation held: $(cat /tmp/dd)"; done
agent A off nc
expect_rc 0 "off nc with the reservation released"
expect_out "Success: Powered OFF" "off nc with the reservation released"
for d in $C1 $C3; do
  if write_direct "$d"; then fail "fence_nvme confirmed the fence of nc but C still writes $d (no reservation held)"; fi
  grep -q "Invalid exchange" /tmp/dd || fail "C's write to $d failed, but not with EBADE: $(cat /tmp/dd)"
  say "C's O_DIRECT write to $d after the fence: $(tr '\n' ' ' </tmp/dd)"
  [ "$(rtype_on "$d")" = 5 ] || fail "$d holds rtype '$(rtype_on "$d")' after the fence, expected 5"
done
[ "$(grep -c 'acquired before the preempt' /tmp/out)" = 2 ] || fail "off nc: the reservation was not acquired on both devices"
agent B status nc
expect_rc 2 "status nc after the fence with the reservation released"
say "final reports: $A1: $(keys_on $A1); $A3: $(keys_on $A3)"

say "--- 7. the action table"
# B (nb, unfenced again in 6) and A (na) are the last registrants: unregistered, the
# namespaces have no registrant and no reservation left.
for d in $B1 $B3; do
  nvme-resv register "$d" --rrega unregister --crkey "$(key_of nb)" >/dev/null || fail "unregister nb from $d"
done
for d in $A1 $A3; do
  nvme-resv register "$d" --rrega unregister --crkey "$(key_of na)" >/dev/null || fail "unregister na from $d"
  [ -z "$(keys_on "$d" | tr -d ' ')" ] || fail "$d still has registrants: $(keys_on "$d")"
done
export A1 A3 B1 B3 C1 C3
sh /usr/local/share/fence-nvme/actions.sh /usr/local/share/fence-nvme/actions.tsv || fail "the action table"

say "--- 8. the watchdog companions"
# C's record (/tmp/state.C: key nc on C1, C3) from step 1; C was fenced in step 2, and
# again in step 6, and not registered since.
has_key "$A1" nc && fail "nc registered again"
fence_nvme_check test --state-file /tmp/state.C 2>/tmp/check; crc=$?
sed 's/^/    [check C] /' /tmp/check
[ $crc = 2 ] || fail "fence_nvme_check on fenced C: exit $crc, expected 2"
# B is registered (tb, the table's last unfencing): the hard-reboot variant returns 0.
fence_nvme_check_hardreboot test --state-file /tmp/actions-state.B 2>/tmp/check; crc=$?
[ $crc = 0 ] || fail "fence_nvme_check_hardreboot on registered B: exit $crc: $(cat /tmp/check)"
# A device that cannot be checked (no reservations): 1, and no reboot.
printf 'key=%s\ndevice=%s\n' "$(key_of nc)" "$NORESV" >/tmp/state.noresv
fence_nvme_check_hardreboot test --state-file /tmp/state.noresv 2>/tmp/check; crc=$?
[ $crc = 1 ] || fail "fence_nvme_check_hardreboot on an unreadable device: exit $crc: $(cat /tmp/check)"
fence_nvme_check_hardreboot repair 2; crc=$?
[ $crc = 2 ] || fail "fence_nvme_check_hardreboot repair 2: exit $crc"
say "hardreboot variant: 0 on registered B, 1 on an unreadable device, repair 2 -> 2; the guest is still up"
say "PASS up to the reboot; fence_nvme_check_hardreboot on fenced C must now restart the guest"
echo HWTEST-GUEST-EXPECT-RESTART
sleep 1
fence_nvme_check_hardreboot test --state-file /tmp/state.C; crc=$?
fail "fence_nvme_check_hardreboot on fenced C returned (exit $crc) instead of rebooting"
