#!/bin/sh
# Pacemaker's real fencer driving fence_nvme against the kernel NVMe target, inside the
# hwtests guest: Debian's corosync and pacemaker 2.1.5 binaries (carried in by
# run-pacemaker) form a one-node cluster "node1" on host A; host B stands for "node2"
# and unfences itself with fence_nvme as its own Pacemaker would.
#   1. fence_nvme is a stonith resource (devices: A's two reservation-capable namespaces,
#      provides=unfencing): Pacemaker unfences node1 (`on` through pacemaker-fenced), the
#      resource starts, its monitor runs
#   2. `stonith_admin --fence node2`: pacemaker-fenced runs `off`, node2's key is gone from
#      both namespaces (nvme-cli's report) and B's O_DIRECT writes fail with EBADE
#   3. `stonith_admin --fence node1` (itself): refused by the agent, node1 keeps its key
set -u
t() { cut -d' ' -f1 /proc/uptime; }
say() { echo "pcmk-guest[$(t)s]: $*"; }
log=/var/log/pacemaker/pacemaker.log
fail() {
  say "FAIL: $*"
  crm_mon -1 2>&1 | head -30
  for f in /tmp/corosync.log /tmp/pacemakerd.log; do echo "--- $f"; tail -n 20 "$f" 2>/dev/null; done
  grep -a -E 'fence_nvme|fenced.*(error|warning)|controld.*(error|warning)' "$log" 2>/dev/null | tail -n 40
  exit 1
}
until_() { # seconds what cmd...
  lim=$1; what=$2; shift 2; start=$(t)
  until "$@"; do
    awk "BEGIN{exit !($(t) - $start > $lim)}" && fail "timed out after ${lim}s waiting for $what"
    sleep 1
  done
}

A1=${HWTEST_NVME_HOSTS%%,*}; r=${HWTEST_NVME_HOSTS#*,}; B1=${r%%,*}
[ -n "${HWTEST_NVME_HOSTS2:-}" ] || fail "HWTEST_NVME_HOSTS2 unset: run with --resv-namespaces 2"
A3=${HWTEST_NVME_HOSTS2%%,*}; r=${HWTEST_NVME_HOSTS2#*,}; B3=${r%%,*}
say "node1 = host A ($A1,$A3); node2 = host B ($B1,$B3)"
hexkey() { k=$(nvme-resv key-for-node "$1"); echo "${k#0x}"; }
keys_on() { nvme resv-report "$1" --eds 2>/dev/null | sed -n 's/^ *rkey *: *//p' | tr '\n' ' '; }
has_key() { keys_on "$1" | grep -q -w "$(hexkey "$2")"; }
write_direct() { dd if=/dev/zero of="$1" bs=4096 count=1 seek=256 oflag=direct >/tmp/dd 2>&1; }

# ---- the cluster's environment: users, directories, corosync.conf ------------------------
cat >/etc/passwd <<'EOF'
root:x:0:0:root:/root:/bin/sh
hacluster:x:104:108::/var/lib/pacemaker:/bin/false
EOF
cat >/etc/group <<'EOF'
root:x:0:
haclient:x:108:hacluster
EOF
mkdir -p /var
[ -e /var/run ] || ln -s /run /var/run
mkdir -p /etc/corosync /var/lib/pacemaker/cib /var/lib/pacemaker/pengine \
  /var/lib/pacemaker/blackbox /var/lib/pacemaker/cores /var/log/pacemaker /var/log/corosync \
  /var/lib/corosync /run/crm /run/corosync
chown -R 104:108 /var/lib/pacemaker /var/log/pacemaker /run/crm
chmod 750 /var/lib/pacemaker/*
cat >/etc/corosync/corosync.conf <<'EOF'
totem {
	version: 2
	cluster_name: guest
	crypto_cipher: none
	crypto_hash: none
}
logging {
	to_stderr: yes
	to_logfile: no
	to_syslog: no
}
quorum {
	provider: corosync_votequorum
}
nodelist {
	node {
		name: node1
		nodeid: 1
		ring0_addr: 127.0.0.1
	}
}
EOF

# ---- node2 (host B) unfences itself, as its own Pacemaker would -------------------------
printf 'nodename=node2\naction=on\nport=node2\ndevices=%s,%s\nstate_file=/tmp/state.B\n' "$B1" "$B3" \
  | fence_nvme || fail "host B could not unfence itself as node2"
for d in $B1 $B3; do write_direct "$d" || fail "B cannot write $d before the fence: $(cat /tmp/dd)"; done

# ---- 1. the cluster, the stonith resource, automatic unfencing ----------------------------
corosync -f >/tmp/corosync.log 2>&1 &
COROSYNC=$!
pacemakerd -f >/tmp/pacemakerd.log 2>&1 &
PACEMAKERD=$!
online() {
  kill -0 "$COROSYNC" 2>/dev/null || fail "corosync exited"
  kill -0 "$PACEMAKERD" 2>/dev/null || fail "pacemakerd exited"
  crm_mon -1 2>/dev/null | grep -q 'Online: \[ node1 \]'
}
until_ 240 "node1 online" online
say "cluster up: $(crm_mon -1 | grep -E 'Current DC' | tr -s ' ')"
cibadmin --create -o resources --xml-text "
<primitive id=\"fence-nvme\" class=\"stonith\" type=\"fence_nvme\">
  <instance_attributes id=\"fence-nvme-ia\">
    <nvpair id=\"fence-nvme-devices\" name=\"devices\" value=\"$A1,$A3\"/>
    <nvpair id=\"fence-nvme-hosts\" name=\"pcmk_host_list\" value=\"node1 node2\"/>
  </instance_attributes>
  <meta_attributes id=\"fence-nvme-meta\">
    <nvpair id=\"fence-nvme-provides\" name=\"provides\" value=\"unfencing\"/>
  </meta_attributes>
  <operations><op id=\"fence-nvme-monitor\" name=\"monitor\" interval=\"30s\"/></operations>
</primitive>" || fail "cibadmin refused the stonith resource"
say "stonith resource fence-nvme: fence_nvme devices=$A1,$A3 provides=unfencing"
started() { crm_mon -1 2>/dev/null | grep -q 'fence-nvme.*Started node1'; }
until_ 180 "fence-nvme started (after node1's unfencing)" started
oplog() { grep -a -m1 "Operation '$1' \[[0-9]*\] targeting $2 using fence-nvme returned $3" "$log" | sed 's/^.*Operation/Operation/'; }
[ -n "$(oplog on node1 0)" ] || fail "no successful on (unfencing) of node1 by fence-nvme in Pacemaker's log"
for d in $A1 $A3; do has_key "$d" node1 || fail "node1's key not on $d after unfencing: $(keys_on "$d")"; done
say "node1 unfenced by Pacemaker: $(oplog on node1 0)"
say "reports: $A1: $(keys_on "$A1")/ $A3: $(keys_on "$A3")"
stonith_admin --query fence-nvme --timeout 30 >/tmp/q 2>&1 || fail "monitor through the fencer failed: $(cat /tmp/q)"
say "stonith_admin --query fence-nvme (the agent's monitor via pacemaker-fenced): exit 0"

# ---- 2. fence node2 through pacemaker-fenced -----------------------------------------------
T0=$(t)
stonith_admin --fence node2 --timeout 60 >/tmp/f 2>&1 || fail "stonith_admin --fence node2: $(cat /tmp/f)"
say "stonith_admin --fence node2: exit 0 after $(awk "BEGIN{print $(t)-$T0}")s"
[ -n "$(oplog off node2 0)" ] || fail "no successful off of node2 by fence-nvme in Pacemaker's log"
say "pacemaker-fenced: $(oplog off node2 0)"
for d in $A1 $A3; do
  has_key "$d" node2 && fail "node2's key still on $d after Pacemaker fenced it: $(keys_on "$d")"
  has_key "$d" node1 || fail "node1's key gone from $d"
done
for d in $B1 $B3; do
  if write_direct "$d"; then fail "B still writes $d after the fence"; fi
  grep -q "Invalid exchange" /tmp/dd || fail "B's write to $d failed, but not with EBADE: $(cat /tmp/dd)"
  say "B's O_DIRECT write to $d: $(tr '\n' ' ' </tmp/dd)"
done
say "reports: $A1: $(keys_on "$A1")/ $A3: $(keys_on "$A3")"
stonith_admin --history node2 2>&1 | sed 's/^/    /'

# ---- 3. Pacemaker asked to fence node1 from node1 ------------------------------------------
if stonith_admin --fence node1 --timeout 30 >/tmp/f 2>&1; then
  fail "fencing node1 from node1 succeeded"
fi
grep -a -q "fence_nvme_off.*refusing to fence node node1" "$log" || fail "the agent's refusal is not in Pacemaker's log"
for d in $A1 $A3; do has_key "$d" node1 || fail "node1's key gone from $d after a refused self-fence"; done
say "stonith_admin --fence node1 refused: $(grep -a -m1 'refusing to fence node node1' "$log" | sed 's/^.*Failed: //' | cut -c1-160)"
say "PASS"
