# Guest kernel for hwtests/guest/run (sourced; uses its log, phase, die and $cache).
#
# Picks the kernel the guest boots, in this order:
#   1. the pinned one (HWTEST_KERNEL_ABI / HWTEST_KERNEL_VERSION), from the cache or
#      downloaded from the pinned suite and checked against the pinned sha256 values;
#   2. when the pinned version is gone from the archive (backports keep only the current
#      one): the kernel an earlier run already chose in its place (recorded in the cache);
#   3. otherwise the current linux-image-<flavour> of the pinned suite, then of each suite
#      in HWTEST_KERNEL_FALLBACK_SUITES (default "trixie-backports sid") — the first one
#      that passes the check below. apt verifies the downloads against the suite's signed
#      Release file (private sources list and lists, the system's apt is not touched).
#      Every such run says loudly that the pin is stale and which kernel it used.
# Before anything boots, kernel_check inspects the unpacked packages: Linux >= 6.13
# (nvmet's per-namespace resv_enable), a kernel image, and every module the guest loads
# (HWTEST_GUEST_MODULES and their depends=) present as a .ko or listed in modules.builtin,
# with nvmet.ko offering the resv_enable attribute.
#
# Cache layout (shared by every cache that links apt/, debs/ and kernel/, see
# nvme-resv/tests/guest/run-device-tests):
#   debs/<pkg>_<version>_amd64.deb         downloaded packages
#   apt/<suite>/                           private apt sources list, lists and cache
#   kernel/<abi>/{vmlinuz,kernel/,modules.builtin,.complete}   unpacked kernel
#   kernel/<abi>-ko/                       decompressed modules for the initramfs
#   kernel/stale-pin-<abi>_<version>       "<abi> <version> <suite>" chosen in a stale pin's place

# ---- pinned guest kernel (Debian trixie-backports, cloud flavour) -------------------
# Override ABI and version (plus the suite if needed) to pin another kernel; the sha256
# values then default to "any" (apt's signed index alone vouches for the download).
kabi=${HWTEST_KERNEL_ABI:-7.3.4+deb13-cloud-amd64}
kver=${HWTEST_KERNEL_VERSION:-7.3.4-1~bpo13+1}
ksuite=${HWTEST_KERNEL_SUITE:-trixie-backports}
kmirror=${HWTEST_KERNEL_MIRROR:-http://deb.debian.org/debian}
kflavour=${HWTEST_KERNEL_FLAVOUR:-cloud-amd64}
kfallback_suites=${HWTEST_KERNEL_FALLBACK_SUITES:-trixie-backports sid}
kkeyring=${HWTEST_KERNEL_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
declare -A kpin_sha=()
if [[ -z ${HWTEST_KERNEL_ABI:-} && -z ${HWTEST_KERNEL_VERSION:-} ]]; then
  kpin_sha[binary]=${HWTEST_KERNEL_BINARY_SHA256:-c4fbc8e404958693b28825474c20742d70594d65ca58aea7be6a279c81eb6fa0}
  kpin_sha[modules]=${HWTEST_KERNEL_MODULES_SHA256:-359f04c363b7d3c5f9ce999ccb7351e00cc8eec0a30d6bc1cda37734987fc43d}
  kpin_sha[base]=${HWTEST_KERNEL_BASE_SHA256:-e08baa43706ba6e8daff58029b039f46beecfb3b3750c6fa0d6d5ca508a46a43}
else
  kpin_sha[binary]=${HWTEST_KERNEL_BINARY_SHA256:-any}
  kpin_sha[modules]=${HWTEST_KERNEL_MODULES_SHA256:-any}
  kpin_sha[base]=${HWTEST_KERNEL_BASE_SHA256:-any}
fi
# nvmet gained per-namespace reservations (configfs resv_enable) in Linux 6.13.
kmin=6.13
guest_modules=${HWTEST_GUEST_MODULES:-configfs nvmet nvme-fabrics nvme-loop}

# Set by kernel_select: the kernel to boot and, when it is not the pin, why.
kdir=""
kused_abi=""
kused_ver=""
kstale_note=""
mod_order=()

# The upstream version in a Debian kernel ABI: 7.3.4+deb13-cloud-amd64 -> 7.3.4,
# 6.1.0-28-cloud-amd64 -> 6.1.0.
abi_upstream() { local v=${1%%[-+]*}; echo "${v:-0}"; }

declare -A apt_ready=()
apt_o=()
# Private apt configuration for one suite; updates its lists once per run.
apt_suite() { # suite -> 0 when its index is usable (apt_o set), 1 with the reason logged
  local suite=$1 d=$cache/apt/$1
  mkdir -p "$d/lists/partial" "$d/cache/archives/partial"
  echo "deb [signed-by=$kkeyring] $kmirror $suite main" >"$d/sources.list"
  apt_o=(-o "Dir::Etc::sourcelist=$d/sources.list" -o Dir::Etc::sourceparts=-
    -o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache" -o Dir::State::status=/dev/null
    -o APT::Sandbox::User=root)
  [[ -n ${apt_ready[$suite]:-} ]] && return 0
  if ! apt-get "${apt_o[@]}" update -qq >"$d/update.log" 2>&1 \
    || grep -q '^[EW]: ' "$d/update.log"; then
    log "apt-get update of $suite at $kmirror failed: $(grep -E '^[EW]: ' "$d/update.log" | head -n3 | tr '\n' ' ')"
    return 1
  fi
  apt_ready[$suite]=1
}
# Versions of a package in the current suite's index, one a line.
apt_versions() { apt-cache "${apt_o[@]}" madison "$1" 2>/dev/null | awk -F'|' '{ gsub(/ /, "", $2); print $2 }'; }
# apt's candidate (the highest version in the suite's index), empty when there is none.
apt_candidate() { apt-cache "${apt_o[@]}" policy "$1" 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" { print $2 }'; }
deb_path() { echo "$cache/debs/${1}_${2//:/%3a}_amd64.deb"; }
# Downloads pkg=ver into the debs cache (apt checks it against the signed index).
apt_fetch() { # pkg ver
  local out
  mkdir -p "$cache/debs"
  [[ -s $(deb_path "$1" "$2") ]] && return 0
  if ! out=$(cd "$cache/debs" && apt-get "${apt_o[@]}" download -qq "$1=$2" 2>&1); then
    log "apt-get download $1=$2 failed: $out"
    return 1
  fi
  [[ -s $(deb_path "$1" "$2") ]] || { log "apt-get download $1=$2 left no $(deb_path "$1" "$2")"; return 1; }
}

# Unpacks a kernel's packages into kernel/<abi> (vmlinuz, kernel/, modules.builtin).
kernel_unpack() { # abi deb...
  local abi=$1 kd=$cache/kernel/$1 x f
  shift
  rm -rf "$kd.tmp" && mkdir -p "$kd.tmp/x"
  for f; do dpkg-deb -x "$f" "$kd.tmp/x" || die "cannot unpack $f (dpkg-deb -x failed); delete it and rerun"; done
  x=$kd.tmp/x
  for f in "$x/usr/lib/modules/$abi/vmlinuz" "$x/boot/vmlinuz-$abi"; do
    [[ -f $f ]] && { mv "$f" "$kd.tmp/vmlinuz"; break; }
  done
  for f in "$x/usr/lib/modules/$abi" "$x/lib/modules/$abi"; do
    [[ -d $f/kernel && ! -e $kd.tmp/kernel ]] && mv "$f/kernel" "$kd.tmp/kernel"
    [[ -f $f/modules.builtin && ! -e $kd.tmp/modules.builtin ]] && mv "$f/modules.builtin" "$kd.tmp/"
  done
  rm -rf "$x" "$kd" "$kd-ko"
  mv "$kd.tmp" "$kd"
  touch "$kd/.complete"
}

# Resolves a module and its depends= (from .modinfo) into load order, decompressing it
# for busybox insmod. A name without a .ko must be in modules.builtin (when the kernel
# ships one; otherwise it is assumed built in, as nvme-core is in the cloud flavour).
declare -A mod_seen=()
kernel_problems=()
mod_file() { find "$kdir/kernel" \( -name "$1.ko" -o -name "$1.ko.*" \) -print -quit 2>/dev/null; }
mod_builtin() { [[ -f $kdir/modules.builtin ]] && grep -qE "/($1|${1//_/-}|${1//-/_})\.ko\$" "$kdir/modules.builtin"; }
mod_resolve() { # name
  local name=$1 f deps d ko
  [[ -n ${mod_seen[$name]:-} ]] && return 0
  mod_seen[$name]=1
  f=$(mod_file "$name")
  [[ -z $f ]] && f=$(mod_file "${name//_/-}")
  [[ -z $f ]] && f=$(mod_file "${name//-/_}")
  if [[ -z $f ]]; then
    if mod_builtin "$name"; then
      return 0
    elif [[ -f $kdir/modules.builtin ]]; then
      kernel_problems+=("module $name: no $name.ko in the modules package and not built in (modules.builtin)")
    else
      log "module $name: no .ko file and no modules.builtin to check, assuming built in"
    fi
    return 0
  fi
  ko=$kdir-ko/$(basename "${f%.ko*}").ko
  if [[ ! -f $ko ]]; then
    mkdir -p "$(dirname "$ko")"
    case $f in
      *.ko.xz) xz -dc "$f" >"$ko.tmp" ;;
      *.ko.zst) zstd -dcq "$f" >"$ko.tmp" || die "cannot decompress $f (is zstd installed?)" ;;
      *.ko.gz) gzip -dc "$f" >"$ko.tmp" ;;
      *.ko) cp "$f" "$ko.tmp" ;;
      *) die "module $f: unknown compression" ;;
    esac
    mv "$ko.tmp" "$ko"
  fi
  deps=$(tr '\0' '\n' <"$ko" | grep -a '^depends=' | head -n1 | cut -d= -f2)
  for d in ${deps//,/ }; do mod_resolve "$d"; done
  mod_order+=("$ko")
}

# Checks an unpacked kernel against what the guest needs; fills mod_order. Returns 1
# with kernel_problems saying what is missing.
kernel_check() { # abi
  local abi=$1 uv m nvmet
  kdir=$cache/kernel/$abi
  kernel_problems=()
  mod_order=()
  mod_seen=()
  uv=$(abi_upstream "$abi")
  if ! dpkg --compare-versions "$uv" ge "$kmin"; then
    kernel_problems+=("Linux $uv is older than $kmin: its nvmet has no per-namespace resv_enable, so the guest's namespace cannot offer reservations")
  fi
  [[ -s $kdir/vmlinuz ]] || kernel_problems+=("no kernel image (vmlinuz) in the packages")
  if [[ ! -d $kdir/kernel ]]; then
    kernel_problems+=("no modules directory (kernel/) in the packages")
  else
    for m in $guest_modules; do
      if [[ -z $(mod_file "$m") && -z $(mod_file "${m//-/_}") ]] && ! mod_builtin "$m"; then
        kernel_problems+=("module $m (loaded by the guest): no $m.ko in the modules package and not built in")
        mod_seen[$m]=1
      fi
      mod_resolve "$m"
    done
    nvmet=$(printf '%s\n' "${mod_order[@]}" | grep '/nvmet\.ko$' || true)
    if [[ -n $nvmet ]] && ! grep -aq 'resv_enable' "$nvmet"; then
      kernel_problems+=("nvmet.ko has no resv_enable attribute: this nvmet cannot enable reservations on a namespace (upstream has it since Linux $kmin)")
    fi
  fi
  ((${#kernel_problems[@]} == 0))
}
kernel_problem_text() { printf '\n    - %s' "${kernel_problems[@]}"; }

# Fetches (debs cache first, then apt) and unpacks one kernel version from the current
# suite. Returns 1 when its packages are not in the suite's index.
kernel_fetch() { # abi ver [pinned]
  local abi=$1 ver=$2 pinned=${3:-} part pkg deb sha debs=() have_all=1
  for part in binary modules base; do
    [[ -s $(deb_path "linux-$part-$abi" "$ver") ]] || have_all=0
  done
  if ((!have_all)); then
    apt_suite "$ksuite_now" || return 1
    if [[ -z $(apt_versions "linux-binary-$abi" | grep -Fx "$ver") ]] \
      && [[ -z $(apt_versions "linux-image-$abi" | grep -Fx "$ver") ]]; then
      return 1
    fi
  fi
  # 7.x splits the kernel into linux-binary-, linux-modules- and linux-base-<abi>; older
  # kernels ship everything in linux-image-<abi>.
  local parts=(binary modules base)
  if ((!have_all)) && [[ -z $(apt_versions "linux-binary-$abi" | grep -Fx "$ver") ]]; then
    parts=(image base)
  fi
  log "fetching kernel $abi ($ver)$( ((have_all)) && echo " from the package cache" || echo " from $ksuite_now")"
  for part in "${parts[@]}"; do
    pkg=linux-$part-$abi
    deb=$(deb_path "$pkg" "$ver")
    if [[ ! -s $deb ]]; then
      [[ -n $(apt_versions "$pkg" | grep -Fx "$ver") ]] || continue # e.g. no separate -base
      apt_fetch "$pkg" "$ver" || die "cannot download $pkg=$ver from $ksuite_now at $kmirror (see above)"
    fi
    sha=any
    [[ -n $pinned ]] && sha=${kpin_sha[$part]:-any}
    if [[ $sha != any ]] && ! echo "$sha  $deb" | sha256sum -c --quiet - >&2; then
      rm -f "$deb"
      die "sha256 mismatch for $deb (pinned $sha): deleted it; rerun to download it again"
    fi
    debs+=("$deb")
  done
  ((${#debs[@]})) || return 1
  kernel_unpack "$abi" "${debs[@]}"
  phase "kernel $abi ($ver) unpacked"
}

# Tries the current linux-image-<flavour> of one suite. Returns 1 (reason logged) when
# the suite is unreachable or its kernel does not pass kernel_check.
kernel_from_suite() { # suite
  local suite=$1 meta abi ver
  ksuite_now=$suite
  apt_suite "$suite" || return 1
  meta=$(apt_candidate "linux-image-$kflavour") # the suite's current one
  [[ -n $meta ]] || { log "suite $suite: no linux-image-$kflavour"; return 1; }
  abi=$(apt-cache "${apt_o[@]}" show "linux-image-$kflavour=$meta" 2>/dev/null | grep -m1 '^Depends:' \
    | grep -oE "linux-image-[0-9][^ ,]*-$kflavour" | head -n1 | sed 's/^linux-image-//')
  [[ -n $abi ]] || { log "suite $suite: linux-image-$kflavour $meta depends on no linux-image-<abi>"; return 1; }
  ver=$(apt_candidate "linux-image-$abi")
  [[ -n $ver ]] || { log "suite $suite: linux-image-$abi is not in its index"; return 1; }
  # Skip a kernel that is too old before downloading it.
  if ! dpkg --compare-versions "$(abi_upstream "$abi")" ge "$kmin"; then
    log "suite $suite: its current kernel $abi ($ver) is older than $kmin (no nvmet resv_enable), skipping it"
    return 1
  fi
  if [[ ! -f $cache/kernel/$abi/.complete ]]; then
    kernel_fetch "$abi" "$ver" || { log "suite $suite: the packages of $abi ($ver) are not in its index"; return 1; }
  else
    phase "kernel $abi cached"
  fi
  if ! kernel_check "$abi"; then
    log "suite $suite: kernel $abi ($ver) cannot run the guest:$(kernel_problem_text)"
    return 1
  fi
  kused_abi=$abi kused_ver=$ver ksuite_used=$suite
}

stale_banner() { # message lines
  local l
  log "################################################################################"
  for l; do log "WARNING: $l"; done
  log "################################################################################"
}

# Chooses, fetches and checks the guest kernel (see the top of this file); dies with
# the reason when no acceptable kernel can be had.
kernel_select() {
  local record=$cache/kernel/stale-pin-${kabi}_${kver} suite suites=() s abi ver rsuite
  local update_pins="update the pins at the top of hwtests/guest/kernel.sh (hwtests/README.md, \"Guest kernel\")"
  mkdir -p "$cache/kernel"
  # One resolver at a time per kernel cache (other caches may link it).
  exec 8>"$cache/kernel/.lock"
  flock 8
  ksuite_now=$ksuite
  # 1. The pin, cached.
  if [[ -f $cache/kernel/$kabi/.complete ]]; then
    phase "kernel $kabi cached"
    kernel_pinned_ok
    return 0
  fi
  # 2. A replacement chosen by an earlier run, which found the pin gone (no network).
  if [[ -f $record ]]; then
    read -r abi ver rsuite <"$record" || true
    if [[ -n ${abi:-} && -f $cache/kernel/$abi/.complete ]] && kernel_check "$abi"; then
      phase "kernel $abi cached"
      kused_abi=$abi kused_ver=$ver
      kstale_note="the pinned guest kernel $kabi ($kver) was gone from $ksuite when an earlier run looked: the pin is stale; using $abi ($ver, from $rsuite), chosen in its place then (delete $record to look again)"
      stale_banner "$kstale_note" "$update_pins"
      exec 8>&-
      return 0
    fi
  fi
  # 3. The pin, downloaded.
  if kernel_fetch "$kabi" "$kver" pinned; then
    kernel_pinned_ok
    return 0
  fi
  if [[ -n ${apt_ready[$ksuite]:-} ]]; then
    kstale_note="the pinned guest kernel $kabi ($kver) is not in $ksuite at $kmirror any more: the pin is stale"
  else
    kstale_note="the pinned guest kernel $kabi ($kver) is not cached and $ksuite at $kmirror could not be read (see above)"
  fi
  # 4. The current kernel of the pinned suite, then of the fallback suites.
  for suite in $ksuite $kfallback_suites; do
    for s in "${suites[@]}"; do [[ $s == "$suite" ]] && continue 2; done
    suites+=("$suite")
  done
  stale_banner "$kstale_note" "looking for the current linux-image-$kflavour in: ${suites[*]}"
  for suite in "${suites[@]}"; do
    if kernel_from_suite "$suite"; then
      echo "$kused_abi $kused_ver $ksuite_used" >"$record"
      kstale_note+="; using linux-image-$kflavour's current kernel $kused_abi ($kused_ver) from $ksuite_used instead"
      stale_banner "$kstale_note" "$update_pins"
      exec 8>&-
      return 0
    fi
  done
  die "no usable guest kernel: the pinned $kabi ($kver) is not available from $ksuite at $kmirror, and
  no suite of '${suites[*]}' offers a linux-image-$kflavour that passes the check (reasons above).
  The guest needs Linux >= $kmin with nvmet (resv_enable), nvme-fabrics, nvme-loop and configfs.
  Pin a kernel that has them: HWTEST_KERNEL_ABI and HWTEST_KERNEL_VERSION, optionally
  HWTEST_KERNEL_SUITE / HWTEST_KERNEL_MIRROR (e.g. a snapshot.debian.org URL); see hwtests/README.md."
}

# The pinned kernel is unpacked: it must pass the check; it was chosen explicitly, so a
# failure is an error rather than a reason to fall back.
kernel_pinned_ok() {
  kernel_check "$kabi" || die "the pinned guest kernel $kabi ($kver) cannot run the guest:$(kernel_problem_text)
  The guest needs Linux >= $kmin with nvmet (resv_enable), nvme-fabrics, nvme-loop and configfs.
  Pin another kernel (HWTEST_KERNEL_ABI, HWTEST_KERNEL_VERSION, see hwtests/README.md)."
  kused_abi=$kabi kused_ver=$kver
  exec 8>&-
}
