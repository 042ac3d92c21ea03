#!/bin/sh
# One cluster node of cluster.sh: runs as PID 1 of its own PID namespace, in its own
# UTS and mount namespaces, inside network namespace node$1 (started by
# `ip netns exec node$1 unshare --uts --mount --pid --fork --mount-proc`).
#   cluster-node.sh N DEVICE BYID
# N: 1-3; DEVICE: this node's path to the shared namespace (its own nvme-loop host);
# BYID: the /dev/disk/by-id name every node uses for it. Private /run, /dev/shm,
# /dev/disk, /etc/corosync, /var/lib/{pacemaker,corosync}, /var/log/pacemaker; the
# logs and the CIB live under /tmp/cluster/nodeN so cluster.sh can read them.
set -u
n=$1 dev=$2 byid=$3
d=/tmp/cluster/node$n
hostname "node$n"
mkdir -p "$d/etc" "$d/lib/cib" "$d/lib/pengine" "$d/lib/blackbox" "$d/lib/cores" "$d/log" "$d/corosync"
for m in /run /dev/shm /dev/disk; do
  mount -t tmpfs tmpfs "$m" || { echo "node$n: cannot mount a private $m"; exit 1; }
done
mount --bind "$d/etc" /etc/corosync
mount --bind "$d/lib" /var/lib/pacemaker
mount --bind "$d/log" /var/log/pacemaker
mount --bind "$d/corosync" /var/lib/corosync
mkdir -p /run/crm /run/corosync /dev/disk/by-id
ln -s "$dev" "/dev/disk/by-id/$byid"
chown -R 104:108 "$d/lib" "$d/log" /run/crm
chmod 750 "$d"/lib/*
cat >/etc/corosync/corosync.conf <<EOF
totem {
	version: 2
	cluster_name: nvme
	transport: knet
	crypto_cipher: none
	crypto_hash: none
	token: ${CLUSTER_TOKEN_MS:-10000}
}
logging {
	to_stderr: yes
	to_logfile: no
	to_syslog: no
	timestamp: on
}
quorum {
	provider: corosync_votequorum
}
nodelist {
	node {
		name: node1
		nodeid: 1
		ring0_addr: 10.0.0.1
	}
	node {
		name: node2
		nodeid: 2
		ring0_addr: 10.0.0.2
	}
	node {
		name: node3
		nodeid: 3
		ring0_addr: 10.0.0.3
	}
}
EOF
# The whole configuration in the first CIB, validate-with="none": the schema checks of
# every CIB update are the heaviest work the daemons do, and under TCG three nodes of
# them starve corosync. startup-fencing=false: the nodes start one after another.
if [ ! -f /var/lib/pacemaker/cib/cib.xml ]; then
  cat >/var/lib/pacemaker/cib/cib.xml <<CIB
<cib validate-with="none" epoch="1" num_updates="0" admin_epoch="0">
  <configuration>
    <crm_config>
      <cluster_property_set id="cib-bootstrap-options">
        <nvpair id="opt-nqp" name="no-quorum-policy" value="freeze"/>
        <nvpair id="opt-st" name="stonith-timeout" value="120s"/>
        <nvpair id="opt-sf" name="startup-fencing" value="false"/>
      </cluster_property_set>
    </crm_config>
    <nodes/>
    <resources>
      <primitive id="fence-nvme" class="stonith" type="fence_nvme">
        <instance_attributes id="fence-nvme-ia">
          <nvpair id="fence-nvme-devices" name="devices" value="/dev/disk/by-id/$byid"/>
          <nvpair id="fence-nvme-hosts" name="pcmk_host_list" value="node1 node2 node3"/>
        </instance_attributes>
        <meta_attributes id="fence-nvme-meta">
          <nvpair id="fence-nvme-provides" name="provides" value="unfencing"/>
        </meta_attributes>
        <operations><op id="fence-nvme-monitor" name="monitor" interval="120s"/></operations>
      </primitive>
      <primitive id="writer" class="ocf" provider="fenced" type="nvme-writer">
        <instance_attributes id="writer-ia">
          <nvpair id="writer-device" name="device" value="/dev/disk/by-id/$byid"/>
          <nvpair id="writer-log" name="log" value="/tmp/cluster/writer.log"/>
        </instance_attributes>
        <operations><op id="writer-monitor" name="monitor" interval="20s"/></operations>
      </primitive>
      <clone id="canary-clone">
        <primitive id="canary" class="ocf" provider="fenced" type="nvme-canary">
          <instance_attributes id="canary-ia">
            <nvpair id="canary-device" name="device" value="/dev/disk/by-id/$byid"/>
            <nvpair id="canary-log" name="log" value="/tmp/cluster/canary.log"/>
          </instance_attributes>
          <operations><op id="canary-monitor" name="monitor" interval="60s"/></operations>
        </primitive>
      </clone>
    </resources>
    <constraints>
      <rsc_location id="writer-prefers-node1" rsc="writer" node="node1" score="100"/>
    </constraints>
    <rsc_defaults>
      <meta_attributes id="rsc-options">
        <nvpair id="rsc-stickiness" name="resource-stickiness" value="200"/>
      </meta_attributes>
    </rsc_defaults>
  </configuration>
  <status/>
</cib>
CIB
  chown 104:108 /var/lib/pacemaker/cib/cib.xml
  chmod 600 /var/lib/pacemaker/cib/cib.xml
fi
echo "node$n: up as pid $$ in its namespaces; $byid -> $dev"
corosync -f >>"$d/corosync.log" 2>&1 &
echo $! >"$d/corosync.pid"
sleep 1
pacemakerd -f >>"$d/pacemakerd.log" 2>&1 &
echo $! >"$d/pacemakerd.pid"
# PID 1 of the namespace: reap children until cluster.sh kills the node.
while :; do wait; sleep 1; done
