#!/bin/sh
# A three-node Pacemaker cluster that fails over, in the hwtests guest (busybox sh), on
# the kernel NVMe target. Run from the host with fence-nvme/tests/guest/run-cluster.
#
# node1..node3 each run Debian's corosync 3.1.7 (knet) and Pacemaker 2.1.5 in their own
# network, UTS, mount and PID namespaces (cluster-node.sh), joined by veth pairs on a
# bridge (10.0.0.N/24); node N is nvme-loop host N of the target (hosts A, B, C) and
# names namespace 1 by the same /dev/disk/by-id/nvme-eui.<NGUID> link.
#   1. the cluster forms; a fence_nvme stonith resource (that by-id device,
#      provides=unfencing), an O_DIRECT writer (OCF agent nvme-writer, on node1) and a
#      canary clone (nvme-canary: records at each start whether its node's key is
#      registered) are configured; every node is unfenced automatically (its key on the
#      namespace) and the canary found its key at every start
#   2. per failure kind (the node's veth down while its writer keeps running; its corosync
#      killed; CLUSTER_KINDS), CLUSTER_RUNS times: Pacemaker fences the writer's node through
#      fence_nvme by itself, the failed node's writer gets EBADE and never writes again,
#      the writer starts on a survivor; timings failure -> fence confirmed -> writer
#      running elsewhere. The node then comes back (its namespaces' processes killed,
#      its NVMe host reconnected if the target dropped it, a fresh stack started) and
#      must be unfenced (its key registered) before the canary starts there.
#
# The kernel target drops the controller of a fenced host that keeps writing: nvmet's
# traffic-based keep-alive does not count commands it rejects while parsing them (a
# write refused for a reservation conflict), while the host counts their completions as
# traffic and sends no Keep Alive; after kato (5 s) the target declares a fatal error,
# and over the loop transport that deletes the host's controller (its /dev/nvmeXnY
# vanishes). Reservation state is not touched: the host's registration stays removed.
# A host on TCP or RDMA would reconnect; here a node coming back reconnects its host.
set -u
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "cluster[$(t)s]: $*"; }
since() { awk "BEGIN{printf \"%.1f\", $(t) - $1}"; }
dump() {
  for i in 1 2 3; do
    echo "--- node$i console"; tail -n 10 /tmp/cluster/node$i/console.log 2>/dev/null
    echo "--- node$i corosync (tail)"; tail -n 15 /tmp/cluster/node$i/corosync.log 2>/dev/null
    echo "--- node$i pacemaker.log (fence/error lines)"
    grep -a -E 'fence_nvme|stonith|unfenc|fenc.*(error|warn)|error:|Result of' /tmp/cluster/node$i/log/pacemaker.log 2>/dev/null | tail -n 30
    echo "--- node$i pacemaker.log (last 40 lines)"
    tail -n 40 /tmp/cluster/node$i/log/pacemaker.log 2>/dev/null | cut -c1-300
  done
  echo "--- crm_mon"; on_node "${SURV:-1}" crm_mon -1 2>&1 | head -40
  echo "--- writer.log (tail)"; tail -n 10 /tmp/cluster/writer.log 2>/dev/null
  echo "--- canary.log"; cat /tmp/cluster/canary.log 2>/dev/null
  echo "--- controllers: $(ls /sys/class/nvme/ | tr '\n' ' ')"
  free -m
}
# Every node's logs (corosync, pacemaker.log, console) and the writer's and canary's,
# gzipped tar in base64 between two marker lines on the console: run-cluster unpacks
# them on the host after every boot, passed or failed.
save_logs() {
  s=$(t)
  lvl=$(cut -f1 /proc/sys/kernel/printk)
  dmesg -n 1 # no kernel message inside the block
  echo "CLUSTER-LOGS-BEGIN"
  (cd /tmp && tar -cf - cluster/*.log cluster/node*/*.log cluster/node*/log 2>/dev/null | gzip -c | base64)
  echo "CLUSTER-LOGS-END"
  dmesg -n "$lvl"
  say "logs sent to the host in $(since "$s")s"
}
# The busiest processes (busybox top), when a wait drags on.
hogs() { top -b -n 1 2>/dev/null | sed -n '4,11p' | cut -c1-150 | sed 's/^/    /'; }
fail() { say "FAIL: $*"; dump; save_logs; exit 1; }
# Each node's state in the CIB (cheaper than crm_mon, which runs the scheduler).
states() {
  on_node "${SURV:-1}" cibadmin -Q --scope status 2>/dev/null | grep -o '<node_state [^>]*' |
    sed 's/.* uname="\([^"]*\)".* crmd="\([^"]*\)".*/\1:\2/' | tr '\n' ' '
  return 0
}
wait_for() { # seconds cmd...: 0 when cmd succeeded in time, 1 when not
  lim=$1; shift; s=$(t)
  until "$@"; do
    awk "BEGIN{exit !($(t) - $s > $lim)}" && return 1
    sleep "${POLL:-5}"
  done
  return 0
}
until_() { # seconds what cmd...: polls every $POLL seconds (the timings come from the logs;
  # a cibadmin or crm_resource query each second slows the cluster down under TCG)
  lim=$1; what=$2; shift 2; s=$(t); next=30
  until "$@"; do
    awk "BEGIN{exit !($(t) - $s > $lim)}" && fail "timed out after ${lim}s waiting for $what"
    if awk "BEGIN{exit !($(t) - $s > $next)}"; then
      say "still waiting for $what ($next s): $(states); load $(cut -d' ' -f1-3 /proc/loadavg)"
      hogs
      next=$((next + 60))
    fi
    sleep "${POLL:-5}"
  done
}

# iproute2's ip (veth, bridge, netns), carried in: busybox sh would run its own applet
# for a plain `ip`, whatever PATH says.
ip() { /usr/local/bin/ip "$@"; }
[ -x /usr/local/bin/ip ] || { echo "cluster: no /usr/local/bin/ip (run-cluster adds it)"; exit 1; }
RUNS=${CLUSTER_RUNS:-1}
KINDS=${CLUSTER_KINDS:-network-cut corosync-killed}
for k in $KINDS; do
  case $k in corosync-killed|network-cut) ;; *) echo "cluster: unknown failure kind '$k' in CLUSTER_KINDS"; exit 1 ;; esac
done
share=/usr/local/share/fence-nvme
# Namespace 1's NGUID (init.sh): the kernel's and udev's name for it on every host.
NGUID=fe0ced00000040008000000000000001
BYID=nvme-eui.$NGUID
SUBNQN=$(cat /sys/class/nvme/nvme0/subsysnqn)
# Node N is host N (init.sh's host IDs); DEVn is its current path to namespace 1.
host_uuid() { printf '%08x-0000-4000-8000-%012x' "$1" "$1"; }
host_ctrl() { # N: host N's controller (nvmeX), if connected
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/hostnqn" 2>/dev/null)" = "nqn.2014-08.org.nvmexpress:uuid:$(host_uuid "$1")" ] && { echo "${c##*/}"; return 0; }
  done
  return 1
}
host_dev() { # N: host N's block device of nsid 1
  c=$(host_ctrl "$1") || return 1
  for d in /sys/class/nvme/$c/${c}n*; do
    [ "$(cat "$d/nsid" 2>/dev/null)" = 1 ] && [ -b "/dev/${d##*/}" ] && { echo "/dev/${d##*/}"; return 0; }
  done
  return 1
}
connect_host() { # N: host N logs in to the target again (what a rebooted host does)
  id=$(host_uuid "$1")
  exec 3<>/dev/nvme-fabrics || fail "open /dev/nvme-fabrics"
  printf 'transport=loop,nqn=%s,hostnqn=nqn.2014-08.org.nvmexpress:uuid:%s,hostid=%s' "$SUBNQN" "$id" "$id" >&3 \
    || fail "host $1 cannot connect to $SUBNQN"
  read -r line <&3
  exec 3>&-
  say "host $1 connected again: $line"
}
dev_of() { eval "echo \$DEV$1"; }
for i in 1 2 3; do d=$(host_dev $i) || fail "no device for host $i"; eval "DEV$i=$d"; done
hexkey() { k=$(nvme-resv key-for-node "$1"); echo "${k#0x}"; }
# The keys on namespace 1 as a survivor's host reads them (a failed report is an error,
# never an empty list).
keys_on() {
  out=$(nvme resv-report "$(dev_of "${SURV:-1}")" --eds 2>&1) || { echo "REPORT-FAILED: $out" | head -n1; return 1; }
  echo "$out" | sed -n 's/^ *rkey *: *//p' | tr '\n' ' '
}
has_key() { k=$(keys_on) && echo "$k" | grep -q -i -w "$(hexkey "$1")"; }
no_stray_files() { # a regular file at a device path means a writer wrote to tmpfs
  for f in /dev/nvme*; do [ -f "$f" ] && fail "$f is a regular file (a write created it after the device vanished)"; done
  return 0
}
say "memory at start: $(free -m | awk '/Mem:/{print $2" MiB total, "$7" MiB available"}'); load: $(cat /proc/loadavg)"

# Pacemaker logs wall-clock times (HH:MM:SS.mmm); the writer logs uptime. One reference
# taken as the second turns maps the first onto the second.
s0=$(date +%s); while [ "$(date +%s)" = "$s0" ]; do :; done
UP0=$(t); SOD0=$(date -u +%H:%M:%S | awk -F: '{print $1 * 3600 + $2 * 60 + $3}')
log_up() { # "HH:MM:SS.mmm" -> uptime
  echo "$1" | awk -F: -v sod0="$SOD0" -v up0="$UP0" '{ s = $1 * 3600 + $2 * 60 + $3 - sod0; if (s < -43200) s += 86400; printf "%.2f", up0 + s }'
}
timeline() { # T0 X: what the survivors' corosync and Pacemaker logged about node X's
  # failure, seconds after T0 (the lines that explain a failover's time)
  for i in 1 2 3; do
    [ "$i" = "$2" ] && continue
    grep -a -E "not scheduled|Token has not been received|A processor failed|A new membership|link: host: $2 link: 0 is down|Members left|non-primary" /tmp/cluster/node$i/corosync.log 2>/dev/null | sed "s/^/node$i corosync /"
    grep -a -E "peer on the DC|DC node|S_ELECTION|Election|-> S_INTEGRATION|-> S_FINALIZE|-> S_POLICY_ENGINE|-> S_TRANSITION_ENGINE|-> S_IDLE|will be fenced|Scheduling .*fenc|equesting .*fenc|wants to fence|Fence operation|node$2 .*(lost|left|dead)|Result of start operation for writer|Quorum" /tmp/cluster/node$i/log/pacemaker.log 2>/dev/null | sed "s/^/node$i pacemaker /"
  done | awk -v sod0="$SOD0" -v up0="$UP0" -v t0="$1" '{
      split($5, a, ":"); if (a[3] == "") next
      s = a[1] * 3600 + a[2] * 60 + a[3] - sod0; if (s < -43200) s += 86400
      u = up0 + s; if (u < t0 - 1) next
      m = $0; sub(/^[^ ]+ [^ ]+ [^ ]+ [^ ]+ [^ ]+ +/, "", m)
      printf "%8.1f %s %s %s\n", u - t0, $1, $2, substr(m, 1, 200) }' | sort -n | head -n 100 | sed 's/^/    +/'
}
plog_first() { # after-uptime regex: uptime of the first line of any node's pacemaker.log matching, after the given uptime
  for i in 1 2 3; do grep -a -E "$2" /tmp/cluster/node$i/log/pacemaker.log 2>/dev/null; done |
    while read -r _ _ hms _; do log_up "$hms"; echo; done | awk -v a="$1" '$1 > a' | sort -n | head -n1
}

# ---- modules, users, directories, the bridge -----------------------------------------------
for m in llc stp bridge veth; do insmod /lib/modules/extra/$m.ko || fail "insmod $m"; done
# No address-space randomisation: every process then maps Pacemaker's and glib's
# libraries at the same addresses, and TCG reuses the code it translated for one
# process in the next (the 21 daemons' starts and every agent, probe and dd); the
# cluster's behaviour does not depend on where libraries are mapped.
echo 0 >/proc/sys/kernel/randomize_va_space
cat >/etc/passwd <<'EOF'
root:x:0:0:root:/root:/bin/sh
hacluster:x:104:108::/var/lib/pacemaker:/bin/false
EOF
cat >/etc/group <<'EOF'
root:x:0:
haclient:x:108:hacluster
EOF
[ -e /var/run ] || { mkdir -p /var && ln -s /run /var/run; }
# /dev/disk: the mount point each node covers with its own tmpfs (by-id link to its host).
mkdir -p /etc/corosync /var/lib/pacemaker /var/log/pacemaker /var/lib/corosync /tmp/cluster /dev/disk
: >/tmp/cluster/writer.log
: >/tmp/cluster/canary.log
chmod 666 /tmp/cluster/writer.log /tmp/cluster/canary.log
ip link add br0 type bridge || fail "no bridge"
ip link set br0 up
for i in 1 2 3; do
  mkdir -p /tmp/cluster/node$i
  ip netns add node$i || fail "ip netns add node$i"
  ip link add veth$i type veth peer name eth0 netns node$i || fail "veth$i"
  ip link set veth$i master br0 up
  ip -n node$i addr add 10.0.0.$i/24 dev eth0
  ip -n node$i link set eth0 up
  ip -n node$i link set lo up
done

INIT1="" INIT2="" INIT3=""
ns_init() { # N: node N's namespace init (PID 1 of its PID namespace), as a root-namespace PID
  for p in $(ip netns pids node$1); do
    awk '/^NSpid:/ { exit !(NF > 2 && $NF == 1) }' /proc/$p/status 2>/dev/null && { echo "$p"; return 0; }
  done
  return 1
}
start_node() { # N
  ip netns exec node$1 unshare --uts --mount --pid --fork --mount-proc \
    sh $share/cluster-node.sh "$1" "$(dev_of "$1")" "$BYID" >>/tmp/cluster/node$1/console.log 2>&1 &
  # Found by what it is, not by whose child it is: the background job may be a shell
  # running ip, or ip itself (then unshare), depending on how busybox forked it.
  c=""
  for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    c=$(ns_init "$1") && break
    sleep 0.5
  done
  [ -n "$c" ] || fail "node$1's namespace init did not start"
  eval "INIT$1=$c"
}
init_of() { eval "echo \$INIT$1"; }
on_node() { # N cmd...: run in node N's namespaces (for the cluster tools' IPC)
  i=$1; shift
  nsenter -t "$(init_of "$i")" -m -u -n -p "$@"
}
kill_node() { # N: every process of the node (its "power cut")
  for p in $(ip netns pids node$1); do kill -9 "$p" 2>/dev/null; done
  sleep 1
}
kill_corosync() { # N
  for p in $(ip netns pids node$1); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = corosync ] && kill -9 "$p" && return 0
  done
  return 1
}
mon() { on_node "$SURV" crm_mon -1 2>/dev/null; }
# Under TCG on a loaded host a guest stall of 10-15 s makes pacemakerd find its
# sub-daemons unresponsive and kill them, sometimes until it gives up ("staying down
# after fatal error"); a node that has not joined in 240 s is started again, up to three
# times (said in the log: this is the harness, not what is tested).
join_node() { # N
  for attempt in 1 2 3; do
    start_node "$1"
    wait_for 240 node_online "$1" && return 0
    # crmd online but the join not yet confirmed: one last look before the restart
    sleep 15
    node_online "$1" && return 0
    say "node$1 not online after 240 s (attempt $attempt; $(states)): restarting its stack"
    grep -a -E 'staying down|unresponsive' /tmp/cluster/node$1/log/pacemaker.log 2>/dev/null | tail -n 3 | cut -c1-200
    kill_node "$1"
  done
  fail "node$1 did not come online in three attempts"
}
# Cheap probes (crm_mon runs the whole scheduler): the CIB's node_state entries, and
# crm_resource --locate.
node_online() { on_node "$SURV" cibadmin -Q --scope status 2>/dev/null | grep '<node_state ' | grep "uname=\"node$1\"" | grep 'crmd="online"' | grep -q 'join="member"'; }
online_all() { node_online 1 && node_online 2 && node_online 3; }
writer_node() { on_node "$SURV" crm_resource --locate --resource writer 2>/dev/null | sed -n 's/.*is running on: \(node[0-9]\).*/\1/p' | head -n1; }
canary_on() { # N after: a canary start on node N after the given uptime
  awk -v a="$2" -v n="node$1" '$1 > a && $2 == n && $3 == "start"' /tmp/cluster/canary.log | head -n1
}
canary_started() { [ -n "$(canary_on "$1" "$2")" ]; }

# ---- 1. the cluster ----------------------------------------------------------------------
# One node after another: three stacks starting at once starve each other under TCG.
T0=$(t)
SURV=1
join_node 1
say "node1 online after $(since "$T0")s"
join_node 2
say "node2 online after $(since "$T0")s"
join_node 3
until_ 240 "three nodes online" online_all
say "cluster of three online after $(since "$T0")s: $(mon | grep -E 'Current DC' | tr -s ' ')"
say "memory: $(free -m | awk '/Mem:/{print $3" MiB used, "$7" MiB available"}'); load: $(cat /proc/loadavg); the busiest processes:"
hogs
say "configured (the first CIB): fence_nvme devices=/dev/disk/by-id/$BYID provides=unfencing; writer (O_DIRECT) prefers node1; canary clone"
writer_on() { [ "$(writer_node)" = "node$1" ]; }
until_ 300 "the writer started on node1" writer_on 1
for i in 1 2 3; do until_ 120 "node$i unfenced (its key on the namespace)" has_key node$i; done
for i in 1 2 3; do until_ 120 "the canary started on node$i" canary_started "$i" 0; done
say "writer on node1 after $(since "$T0")s; keys on the namespace: $(keys_on)"
grep -q 'registered=no' /tmp/cluster/canary.log && fail "a canary started on a node whose key was not registered: $(cat /tmp/cluster/canary.log)"
grep -a -q 'node1 ok' /tmp/cluster/writer.log || fail "node1's writer wrote nothing"
say "canary starts, each after its node's key was registered: $(tr '\n' ';' </tmp/cluster/canary.log)"

# ---- 2. failures ---------------------------------------------------------------------------
results=""
run=0
while [ "$run" -lt "$RUNS" ]; do
  run=$((run + 1))
  for kind in $KINDS; do
    X=$(writer_node | tr -d node)
    [ -n "$X" ] || fail "the writer is not running anywhere"
    SURV=$((X % 3 + 1))
    # The DC (the CIB's dc-uuid; node N has id N): losing it adds an election and a join
    # before anything is scheduled.
    DC=$(on_node "$SURV" cibadmin -Q 2>/dev/null | head -c 2000 | sed -n 's/.*dc-uuid="\([0-9]*\)".*/node\1/p' | head -n1)
    isdc="not the DC (${DC:-unknown})"
    [ "$DC" = "node$X" ] && isdc="the DC"
    say "--- run $run, $kind: node$X runs the writer and is $isdc; watching from node$SURV; load: $(cat /proc/loadavg)"
    T0=$(t)
    case $kind in
      corosync-killed) kill_corosync "$X" || fail "no corosync in node$X" ;;
      network-cut) ip link set veth$X down || fail "veth$X down" ;;
    esac
    fenced() { [ -n "$(plog_first "$T0" "Fence operation [0-9]+ for node$X succeeded")" ]; }
    POLL=2; until_ 300 "node$X fenced" fenced; POLL=5
    moved() { w=$(writer_node); [ -n "$w" ] && [ "$w" != "node$X" ]; }
    until_ 300 "the writer started on a survivor" moved
    W=$(writer_node)
    ebade() { awk -v t0="$T0" -v n="node$X" '$1 > t0 && $2 == n && /FAIL.*Invalid exchange/' /tmp/cluster/writer.log | grep -q .; }
    until_ 60 "node$X's writer to get EBADE" ebade
    wrote() { awk -v t0="$T0" -v n="$W" '$1 > t0 && $2 == n && $3 == "ok"' /tmp/cluster/writer.log | grep -q .; }
    until_ 60 "the writer on $W to write" wrote
    # What the device and Pacemaker say, in uptime seconds after the failure.
    TF=$(plog_first "$T0" "Fence operation [0-9]+ for node$X succeeded")
    TO=$(plog_first "$T0" "fence_nvme_off.*key 0x$(hexkey node$X) removed")
    TS=$(plog_first "$T0" "Result of start operation for writer on $W")
    TE=$(awk -v t0="$T0" -v n="node$X" '$1 > t0 && $2 == n && /FAIL.*Invalid exchange/ {print $1; exit}' /tmp/cluster/writer.log)
    TW=$(awk -v t0="$T0" -v n="$W" '$1 > t0 && $2 == n && $3 == "ok" {print $1; exit}' /tmp/cluster/writer.log)
    LASTOK=$(awk -v t0="$T0" -v n="node$X" '$1 > t0 && $2 == n && $3 == "ok" {l = $1} END {print l}' /tmp/cluster/writer.log)
    rel() { [ -n "$1" ] && awk "BEGIN{printf \"%.1f\", $1 - $T0}" || echo "?"; }
    has_key node$X && fail "node$X's key still on the namespace after its fence: $(keys_on)"
    keys_on >/dev/null || fail "the survivor cannot read the reservation: $(keys_on)"
    # The fenced node keeps its writer running (network cut) or not yet stopped
    # (corosync killed): it must never write again after its first EBADE.
    sleep 12
    AFTER=$(awk -v te="$TE" -v n="node$X" '$1 > te && $2 == n && $3 == "ok"' /tmp/cluster/writer.log | head -n1)
    [ -z "$AFTER" ] || fail "node$X wrote again after its EBADE: $AFTER"
    no_stray_files
    gone=""
    host_ctrl "$X" >/dev/null || gone=$(dmesg | grep -a -E 'keep-alive timer|Removing ctrl' | tail -n 2 | tr -s ' \n' ' ')
    say "run $run $kind: node$X: last write +$(rel "$LASTOK")s, fence_nvme off done +$(rel "$TO")s, fence confirmed +$(rel "$TF")s, first EBADE +$(rel "$TE")s; writer started on $W +$(rel "$TS")s, first write there +$(rel "$TW")s"
    say "node$X's writer after the fence: $(awk -v t0="$T0" -v n="node$X" '$1 > t0 && $2 == n && /FAIL/' /tmp/cluster/writer.log | sed 's/^[0-9.]* //' | sort | uniq -c | tr -s ' \n' ' ')"
    [ -n "$gone" ] && say "the target dropped host $X's controller (keep-alive; see the header): $gone"
    say "keys on the namespace (node$SURV's host): $(keys_on)"
    say "run $run $kind: what the survivors logged (seconds after the failure):"
    timeline "$T0" "$X"
    on_node "$SURV" stonith_admin --history "node$X" 2>/dev/null | head -n 2 | sed 's/^/    /'
    results="$results
  $kind run $run (node$X, $isdc): fence confirmed +$(rel "$TF")s (off +$(rel "$TO")s, EBADE +$(rel "$TE")s), writer started elsewhere +$(rel "$TS")s (writing +$(rel "$TW")s), load $(cut -d' ' -f1-3 /proc/loadavg)"
    # The node comes back: its processes gone, its NVMe host logged in again if the
    # target dropped it, a fresh stack in fresh namespaces on the same network.
    kill_node "$X"
    [ "$kind" = network-cut ] && ip link set veth$X up
    host_ctrl "$X" >/dev/null || connect_host "$X"
    dev=""
    for _ in $(seq 1 40); do dev=$(host_dev "$X") && break; sleep 0.5; done
    [ -n "$dev" ] || fail "host $X has no device for namespace 1 after reconnecting"
    eval "DEV$X=$dev"
    T3=$(t)
    join_node "$X"
    until_ 180 "node$X unfenced again" has_key node$X
    until_ 180 "the canary started on node$X" canary_started "$X" "$T3"
    c=$(canary_on "$X" "$T3")
    case $c in *registered=yes) ;; *) fail "the canary started on node$X before its key was registered: $c" ;; esac
    TU=$(plog_first "$T3" "node$X was unfenced by")
    say "node$X back ($dev): unfenced (Pacemaker's confirmation +$(awk "BEGIN{printf \"%.1f\", ${TU:-0} - $T3}")s), key registered, then the canary started: $c; after $(since "$T3")s"
  done
done
say "timings (failure -> fence confirmed -> writer running elsewhere), seconds:$results"
say "memory at the end: $(free -m | awk '/Mem:/{print $3" MiB used, "$7" MiB available"}'); load: $(cat /proc/loadavg)"
save_logs
say "PASS"
