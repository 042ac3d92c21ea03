#!/usr/bin/env bash
# Runs inside `unshare --mount --net --pid --fork --mount-proc` (started by ./run): a
# one-node corosync + Pacemaker cluster on loopback with private /run, /dev/shm,
# /var/lib/pacemaker and /var/log, so it sees and touches nothing of the host's. Registers
# fence_nvme as a stonith resource and drives it through Pacemaker's real fencer. The host
# has no NVMe namespace, so each call must reach the agent and fail at the device; the
# assertions are on what Pacemaker's log records of the agent's own output.
set -euo pipefail
out=$1      # directory for logs, on the host's filesystem
say() { printf 'pacemaker[%5.1fs]: %s\n' "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" "$*"; }
fail() { say "FAIL: $*"; tail -n 40 /var/log/pacemaker/pacemaker.log >&2 || true; exit 1; }
t0=$(date +%s.%N)
ip link set lo up
for d in /var/lib/pacemaker /run /dev/shm /var/log; do mount -t tmpfs tmpfs "$d"; done
mkdir -p /var/lib/pacemaker/{cib,pengine,blackbox,cores} /var/log/pacemaker /var/log/corosync /run/crm
chown -R hacluster:haclient /var/lib/pacemaker /var/log/pacemaker /run/crm
chmod 750 /var/lib/pacemaker/*
# Debian's /etc/corosync/corosync.conf is already a one-node cluster: node1 on 127.0.0.1.
corosync -f >"$out/corosync.log" 2>&1 &
pacemakerd -f >"$out/pacemakerd.log" 2>&1 &
trap 'cp /var/log/pacemaker/pacemaker.log "$out/pacemaker.log" 2>/dev/null || true' EXIT
until crm_mon -1 2>/dev/null | grep -q 'Online: \[ node1 \]'; do
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{exit !(b - a > 90)}' && fail "node1 not online after 90 s"
  sleep 1
done
say "one-node cluster up: $(crm_mon -1 | grep -E 'Current DC|Online')"

dev=/dev/nvme0n1
cibadmin --create -o resources --xml-text "
<primitive id=\"fence-nvme\" class=\"stonith\" type=\"fence_nvme\">
  <instance_attributes id=\"fence-nvme-ia\">
    <nvpair id=\"fence-nvme-devices\" name=\"devices\" value=\"$dev\"/>
    <nvpair id=\"fence-nvme-hosts\" name=\"pcmk_host_list\" value=\"node1 node2\"/>
  </instance_attributes>
  <operations><op id=\"fence-nvme-monitor\" name=\"monitor\" interval=\"60s\"/></operations>
</primitive>" || fail "cibadmin refused the stonith resource"
say "stonith resource fence-nvme (fence_nvme, devices=$dev) in the CIB"

log=/var/log/pacemaker/pacemaker.log
wait_log() { # seconds what pattern
  local lim=$1 what=$2 pat=$3 s; s=$(date +%s)
  until grep -q -- "$pat" "$log" 2>/dev/null; do
    (($(date +%s) - s > lim)) && fail "no $what in Pacemaker's log after ${lim}s (pattern: $pat)"
    sleep 1
  done
  say "$what: $(grep -m1 -- "$pat" "$log" | sed 's/^.*(log_op_output)[^:]*: //' | cut -c1-300)"
}
until stonith_admin --list-registered 2>/dev/null | grep -q fence-nvme; do
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{exit !(b - a > 120)}' && fail "the fencer never registered fence-nvme"
  sleep 1
done
say "the fencer registered it: $(stonith_admin --list-registered | tr '\n' ' ')"
# Starting the stonith resource runs the agent's monitor through the fencer.
wait_log 60 "monitor through the fencer" "fence_nvme_monitor_1of2.*fence_nvme: ERROR: $dev: open failed: cannot open $dev: No such file or directory"
# provides=unfencing (as for fence_scsi; the metadata's `on` has automatic="1") and a
# resource to run: before it may start on node1, the controller unfences node1 through
# the fencer (`on` for node1, on node1).
crm_resource --resource fence-nvme --meta --set-parameter provides --parameter-value unfencing >/dev/null \
  || fail "crm_resource could not set provides=unfencing"
cibadmin --create -o resources --xml-text '
<primitive id="dummy" class="ocf" provider="pacemaker" type="Dummy">
  <operations><op id="dummy-monitor" name="monitor" interval="60s"/></operations>
</primitive>' || fail "cibadmin refused the Dummy resource"
wait_log 90 "automatic unfencing of node1 (on)" "fence_nvme_on_1of2.*Failed: unfencing node node1 (key 0x"
wait_log 30 "the controller's verdict" "Unfencing of node1 by node1 failed"
sleep 2
crm_mon -1 | grep -q 'dummy.*Started' && fail "Dummy started although node1's unfencing failed"
say "Dummy is not started: $(crm_mon -1 | grep -A3 -i 'resources' | tr -s ' \n' ' ')"
# Fence node2 through the real fencer: `reboot` is remapped to `off` (not advertised).
set +e
stonith_admin --fence node2 --timeout 30 >"$out/fence.out" 2>&1
rc=$?
set -e
say "stonith_admin --fence node2: exit $rc: $(tr '\n' ' ' <"$out/fence.out")"
((rc != 0)) || fail "fencing node2 reported success without any NVMe device"
wait_log 30 "off of node2 through the fencer" "fence_nvme_off_1of2.*Failed: cannot fence node node2"
stonith_admin --history node2 >"$out/history.out" 2>&1 || true
say "history: $(tr '\n' ' ' <"$out/history.out")"
say "PASS (the agent is registered and called by pacemaker-fenced; with no NVMe device here every action fails at the device)"
