#!/bin/busybox sh
# /init of the hwtests guest (busybox initramfs built by hwtests/guest/run).
#
# Sets up the kernel NVMe target: subsystem $SUBNQN with namespace 1 (reservations
# enabled) and namespace 2 (reservations NOT enabled), both backed by files on tmpfs, a
# loop port, and $NHOSTS loop "hosts" (distinct host NQN and host ID) connected to it.
# With HWTEST_RESV_NAMESPACES=2 (run --resv-namespaces 2) also namespace 3, a second
# reservation-capable one, exported per host as HWTEST_NVME_HOSTS2. Namespace n has the
# NGUID fe0ced00000040008000 followed by 00000000000n.
# HWTEST_NS_IDS (run --ns-ids) changes how namespaces identify themselves: "nguid"
# (default) as above, next to the random UUID nvmet gives every namespace; "default"
# keeps the kernel target's defaults (the random UUID only, NGUID zero); "serial"
# reports no UUID, NGUID or EUI-64, and the subsystem's serial and model numbers are
# an EBS volume's (serial vol0123456789abcdef0, model "Amazon Elastic Block Store";
# vendor id 1d0f where the kernel lets it be set), so a namespace is named by Linux's
# fallback, vendor id, serial, model and nsid.
# Then exports the device paths and runs /scenario/run.sh; prints the result marker and
# powers off. Every line here goes to the serial console, which the host keeps as a log.
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -t tmpfs -o size=512m tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
ip link set lo up
hostname hwtest-guest
export HOME=/root TMPDIR=/tmp

marker=HWTEST-GUEST-RESULT:
uptime_s() { cut -d' ' -f1 /proc/uptime; }
finish() { # result
  sync
  echo "guest-init: summary: scenario finished at $(uptime_s)s uptime"
  echo "$marker $1"
  poweroff -f
  sleep 10
}
fail() {
  echo "guest-init: SETUP FAILED: $*"
  finish setup-failed
}

echo "guest-init: kernel $(uname -r), booted in $(uptime_s)s"
for m in /lib/modules/*.ko; do
  insmod "$m" || fail "insmod $m"
done
mount -t configfs configfs /sys/kernel/config || fail "mount configfs"

NHOSTS=${NHOSTS:-3}
SUBNQN=nqn.2014-08.org.fenced:hwtest
N=/sys/kernel/config/nvmet
S=$N/subsystems/$SUBNQN
NS_SIZE=${NS_SIZE:-64M}

mkdir "$S" || fail "mkdir subsystem"
echo 0 >"$S/attr_allow_any_host"
NS_IDS=${HWTEST_NS_IDS:-nguid}
case $NS_IDS in
  nguid|default) ;;
  serial)
    # Before any host connects: nvmet refuses model changes once discovered.
    echo -n vol0123456789abcdef0 >"$S/attr_serial" || fail "attr_serial"
    echo -n "Amazon Elastic Block Store" >"$S/attr_model" || fail "attr_model"
    if [ -e "$S/attr_vendor_id" ]; then
      echo 0x1d0f >"$S/attr_vendor_id" || fail "attr_vendor_id"
    fi
    ;;
  *) fail "HWTEST_NS_IDS=$NS_IDS: only nguid, default or serial" ;;
esac
echo "guest-init: namespace identifiers: $NS_IDS"
host_uuid() { printf '%08x-0000-4000-8000-%012x' "$1" "$1"; }
i=1
while [ "$i" -le "$NHOSTS" ]; do
  hostnqn=nqn.2014-08.org.nvmexpress:uuid:$(host_uuid "$i")
  mkdir "$N/hosts/$hostnqn" || fail "mkdir host $i"
  ln -s "$N/hosts/$hostnqn" "$S/allowed_hosts/$hostnqn" || fail "allow host $i"
  i=$((i + 1))
done

# nsid 1: reservations enabled. nsid 2: reservations not enabled (capability tests).
# nsid 3 (only with HWTEST_RESV_NAMESPACES=2): reservations enabled.
RESV_NAMESPACES=${HWTEST_RESV_NAMESPACES:-1}
case $RESV_NAMESPACES in
  1) nsids="1 2" ;;
  2) nsids="1 2 3" ;;
  *) fail "HWTEST_RESV_NAMESPACES=$RESV_NAMESPACES: only 1 or 2" ;;
esac
for nsid in $nsids; do
  truncate -s "$NS_SIZE" "/tmp/ns$nsid.img" || fail "backing file $nsid"
  mkdir "$S/namespaces/$nsid" || fail "mkdir namespace $nsid"
  echo -n "/tmp/ns$nsid.img" >"$S/namespaces/$nsid/device_path" || fail "device_path $nsid"
  # A distinct NGUID per namespace (Identify Namespace bytes 119:104), as real devices
  # report one: fenced identifies the shared namespace by it (nvmet's default is zero).
  # Like resv_enable, only writable while the namespace is disabled.
  case $NS_IDS in
    nguid)
      echo "fe0ced00-0000-4000-8000-00000000000$nsid" >"$S/namespaces/$nsid/device_nguid" \
        || fail "device_nguid $nsid" ;;
    serial)
      # nvmet reports a UUID descriptor only when the UUID is not zero.
      echo "00000000-0000-0000-0000-000000000000" >"$S/namespaces/$nsid/device_uuid" \
        || fail "device_uuid $nsid" ;;
  esac
  if [ "$nsid" != 2 ]; then
    # Must precede enable: nvmet refuses resv_enable on an enabled namespace (EINVAL).
    echo 1 >"$S/namespaces/$nsid/resv_enable" || fail "resv_enable (kernel too old? needs >= 6.13)"
  fi
  echo 1 >"$S/namespaces/$nsid/enable" || fail "enable namespace $nsid"
done
mkdir "$N/ports/1" || fail "mkdir port"
echo loop >"$N/ports/1/addr_trtype"
ln -s "$S" "$N/ports/1/subsystems/$SUBNQN" || fail "link port"

# Connect each host through the fabrics control device (one write, then read back the
# instance line) and find its controller by host NQN.
ns_dev() { # controller nsid -> /dev/... of that namespace on that controller
  for d in /sys/class/nvme/$1/$1n*; do
    [ -e "$d" ] || continue
    if [ "$(cat "$d/nsid" 2>/dev/null)" = "$2" ]; then
      echo "/dev/${d##*/}"
      return 0
    fi
  done
  return 1
}
hosts=""
hosts2=""
noresv=""
letters="A B C D E F G H"
i=1
for L in $letters; do
  [ "$i" -le "$NHOSTS" ] || break
  id=$(host_uuid "$i")
  hostnqn=nqn.2014-08.org.nvmexpress:uuid:$id
  exec 3<>/dev/nvme-fabrics || fail "open /dev/nvme-fabrics"
  printf 'transport=loop,nqn=%s,hostnqn=%s,hostid=%s' "$SUBNQN" "$hostnqn" "$id" >&3 \
    || fail "connect host $L"
  read -r line <&3
  exec 3>&-
  ctrl=""
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/hostnqn" 2>/dev/null)" = "$hostnqn" ] && ctrl=${c##*/}
  done
  [ -n "$ctrl" ] || fail "no controller for host $L ($line)"
  dev=""
  t=0
  while [ -z "$dev" ] && [ "$t" -lt 100 ]; do
    dev=$(ns_dev "$ctrl" 1) && [ -b "$dev" ] || dev=""
    [ -n "$dev" ] || { sleep 0.1; t=$((t + 1)); }
  done
  [ -n "$dev" ] || fail "no namespace 1 on $ctrl for host $L"
  echo "guest-init: host $L: hostnqn $hostnqn hostid $id -> $ctrl -> $dev"
  eval "export HWTEST_HOST_${L}_NQN=$hostnqn HWTEST_HOST_${L}_ID=$id HWTEST_HOST_${L}_CTRL=$ctrl"
  hosts=${hosts:+$hosts,}$dev
  if [ "$RESV_NAMESPACES" = 2 ]; then
    dev3=""
    t=0
    while [ -z "$dev3" ] && [ "$t" -lt 100 ]; do
      dev3=$(ns_dev "$ctrl" 3) && [ -b "$dev3" ] || dev3=""
      [ -n "$dev3" ] || { sleep 0.1; t=$((t + 1)); }
    done
    [ -n "$dev3" ] || fail "no namespace 3 on $ctrl for host $L"
    echo "guest-init: host $L: namespace 3 -> $dev3"
    hosts2=${hosts2:+$hosts2,}$dev3
  fi
  if [ -z "$noresv" ]; then
    t=0
    while [ -z "$noresv" ] && [ "$t" -lt 100 ]; do
      noresv=$(ns_dev "$ctrl" 2) && [ -b "$noresv" ] || noresv=""
      [ -n "$noresv" ] || { sleep 0.1; t=$((t + 1)); }
    done
    [ -n "$noresv" ] || fail "no namespace 2 on $ctrl"
  fi
  i=$((i + 1))
done
export HWTEST_NVME_HOSTS=$hosts HWTEST_NVME_NORESV=$noresv HWTEST_GUEST=1 HWTEST_NS_IDS=$NS_IDS
[ -z "$hosts2" ] || export HWTEST_NVME_HOSTS2=$hosts2
echo "guest-init: nvmet ready at $(uptime_s)s: HWTEST_NVME_HOSTS=$HWTEST_NVME_HOSTS HWTEST_NVME_NORESV=$HWTEST_NVME_NORESV${hosts2:+ HWTEST_NVME_HOSTS2=$hosts2}"

[ -f /etc/scenario.env ] && . /etc/scenario.env
cd /tmp
sh /scenario/run.sh
rc=$?
echo "guest-init: scenario exit status $rc"
if [ "$rc" = 0 ]; then finish pass; else finish fail; fi
