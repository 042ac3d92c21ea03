#!/usr/bin/env bash
# blockio vs fio on the same file, in the same run: 4 KiB random writes at QD 1 and
# QD 32, and 1 MiB sequential writes. fio runs with ioengine=io_uring, direct=1; blockio
# runs through its example driver (blockio/examples/bench_write.rs), built --release,
# once per VARIANT (named driver settings, so an old and a new strategy run A/B in the
# same run). Within a repetition the tools run in turn, starting one place later on each
# repetition, so drift of a shared disk or CPU hits all of them; the table reports
# medians, medians of per-repetition ratios, and CPU per I/O.
#
#   benches/scripts/blockio-vs-fio.sh            # defaults below
#   REPS=7 RUNTIME=10 FILE=/mnt/x/bench.img benches/scripts/blockio-vs-fio.sh
#   FILE=/dev/nvme1n1 ... (a block device works too; it is overwritten!)
#   VARIANTS='blockio=;legacy=--legacy;spin=--spin-us 20' WORKLOADS=4k-randwrite-qd32 ...
#
# Env: FILE (default /var/tmp/blockio-vs-fio.img, created and laid out if missing),
# SIZE (1G), RUNTIME seconds per run (5), REPS (5), SEQ_QD (32), ENGINE for blockio
# (auto: the library's default; io_uring or sync to force one), FIO_PSYNC (non-empty:
# fio with ioengine=psync runs too, as a second peer; ratios stay against fio's
# io_uring), VARIANTS (`name=driver args` separated by `;`; default
# `blockio=;legacy=--legacy`: the library's defaults, and the settings of every
# measurement before 2026-12-01 15:30 UTC), WORKLOADS (names separated by spaces; default
# all), OUT (a directory for raw results; default a temp dir), CPUS (a `taskset -c` list:
# every tool runs pinned to it, io_uring's worker threads included, so the scheduler's
# placement of submitter and worker — which makes tmpfs at QD 1 bimodal — is the same
# for all; default unpinned).
# CPU is user+system time of the whole process (bash `time`, i.e. wait4's rusage: fio's
# job process and its io_uring threads; blockio's threads, including an SQPOLL thread),
# start-up included, divided by the I/Os the tool reported.
# Needs: fio, jq, python3, cargo. The file system must support O_DIRECT (ext4, xfs, ...).
set -euo pipefail
cd "$(dirname "$0")/../.."

FILE=${FILE:-/var/tmp/blockio-vs-fio.img}
SIZE=${SIZE:-1G}
RUNTIME=${RUNTIME:-5}
REPS=${REPS:-5}
SEQ_QD=${SEQ_QD:-32}
ENGINE=${ENGINE:-auto}
FIO_PSYNC=${FIO_PSYNC:-}
VARIANTS=${VARIANTS:-blockio=;legacy=--legacy}
OUT=${OUT:-$(mktemp -d /var/tmp/blockio-vs-fio.XXXXXX)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/fenced-target}
CPUS=${CPUS:-}
pin=()
if [[ -n $CPUS ]]; then
  command -v taskset >/dev/null || { echo "CPUS needs taskset (util-linux)" >&2; exit 1; }
  taskset -c "$CPUS" true || { echo "CPUS=$CPUS: taskset refuses that CPU list" >&2; exit 1; }
  pin=(taskset -c "$CPUS")
fi

command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 is needed for the summary" >&2; exit 1; }
command -v jq >/dev/null || { echo "jq is needed to read the tools' JSON (apt-get install jq)" >&2; exit 1; }

echo "building the blockio driver (release)..." >&2
cargo build --quiet --release -p blockio --example bench_write
DRIVER=$CARGO_TARGET_DIR/release/examples/bench_write

if [[ ! -b $FILE && ! -s $FILE ]]; then
  echo "laying out $FILE ($SIZE)..." >&2
  fio --name=layout --filename="$FILE" --size="$SIZE" --rw=write --bs=1M --direct=1 \
      --ioengine=psync --output-format=terse >/dev/null
fi
size_bytes=$(python3 -c 'import sys; s=sys.argv[1]; u={"K":1<<10,"M":1<<20,"G":1<<30,"T":1<<40}; print(int(s[:-1])*u[s[-1].upper()] if s[-1].upper() in u else int(s))' "$SIZE")

# workload: name rw bs qd
all_workloads=(
  "4k-randwrite-qd1 randwrite 4096 1"
  "4k-randwrite-qd32 randwrite 4096 32"
  "1m-write-qd$SEQ_QD write 1048576 $SEQ_QD"
)
workloads=()
for w in "${all_workloads[@]}"; do
  if [[ -z ${WORKLOADS:-} || " $WORKLOADS " == *" ${w%% *} "* ]]; then workloads+=("$w"); fi
done
((${#workloads[@]})) || { echo "WORKLOADS=$WORKLOADS matches none of: ${all_workloads[*]%% *}" >&2; exit 1; }

declare -A variant_args=()
tools=(fio)
[[ -n $FIO_PSYNC ]] && tools+=(fio-psync)
IFS=';' read -ra specs <<<"$VARIANTS"
for spec in "${specs[@]}"; do
  [[ $spec == *=* ]] || { echo "VARIANTS: '$spec' is not name=args" >&2; exit 1; }
  name=${spec%%=*}
  [[ $name =~ ^[A-Za-z0-9._-]+$ && $name != fio ]] || { echo "VARIANTS: bad name '$name'" >&2; exit 1; }
  variant_args[$name]=${spec#*=}
  tools+=("$name")
done

mkdir -p "$OUT"
results=$OUT/results.tsv
: >"$results"
TIMEFORMAT='%U %S'

run_fio() { # engine rw bs qd
  "${pin[@]}" fio --name=bench --filename="$FILE" --size="$size_bytes" --ioengine="$1" --direct=1 \
      --rw="$2" --bs="$3" --iodepth="$4" --runtime="$RUNTIME" --time_based \
      --output-format=json 2>/dev/null >"$OUT/last.json"
}

run_variant() { # name rw bs qd
  # shellcheck disable=SC2086 # the variant's arguments are words
  "${pin[@]}" "$DRIVER" --path "$FILE" --size "$size_bytes" --engine "$ENGINE" --rw "$2" --bs "$3" \
      --qd "$4" --runtime "$RUNTIME" ${variant_args[$1]} >"$OUT/last.json"
}

# iops bw_bytes ios, from the tool's JSON (outside the timed part; jq, not python,
# whose start-up takes seconds on a loaded machine)
parse() {
  if [[ $1 == fio* ]]; then
    jq -r '.jobs[0].write | "\(.iops) \(.bw_bytes) \(.total_ios)"' "$OUT/last.json"
  else
    jq -r '"\(.iops) \(.bw_bytes) \(.ios)"' "$OUT/last.json"
  fi
}

ntools=${#tools[@]}
for ((rep = 1; rep <= REPS; rep++)); do
  for w in "${workloads[@]}"; do
    read -r name rw bs qd <<<"$w"
    for ((i = 0; i < ntools; i++)); do
      tool=${tools[$(((i + rep - 1) % ntools))]}
      read -r load _ </proc/loadavg
      if [[ $tool == fio ]]; then
        { time run_fio io_uring "$rw" "$bs" "$qd"; } 2>"$OUT/last.time"
      elif [[ $tool == fio-psync ]]; then
        # a synchronous engine has one request in flight whatever the queue depth
        { time run_fio psync "$rw" "$bs" 1; } 2>"$OUT/last.time"
      else
        { time run_variant "$tool" "$rw" "$bs" "$qd"; } 2>"$OUT/last.time"
      fi
      read -r iops bw ios < <(parse "$tool")
      read -r usr sys <"$OUT/last.time"
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rep" "$tool" "$iops" "$bw" "$ios" \
        "$usr" "$sys" "$load" >>"$results"
      awk -v n="$name" -v r="$rep" -v t="$tool" -v i="$iops" -v b="$bw" -v u="$usr" -v s="$sys" \
        -v l="$load" 'BEGIN { printf "rep %d %-18s %-12s %10.0f IOPS %8.1f MiB/s  cpu %5.2f s  load %s\n", r, n, t, i, b / 1048576, u + s, l }' >&2
    done
  done
done

python3 - "$results" "$RUNTIME" "$REPS" "$FILE" "$CPUS" "${tools[@]}" <<'PY'
import sys, statistics as st
from collections import defaultdict
path, runtime, reps, target, cpus, *tools = sys.argv[1:]
pinned = f" (pinned: taskset -c {cpus})" if cpus else ""
rows = defaultdict(lambda: defaultdict(dict))
loads = []
for line in open(path):
    name, rep, tool, iops, bw, ios, usr, sys_, load = line.rstrip("\n").split("\t")
    rows[name][int(rep)][tool] = (float(iops), float(bw), float(ios), float(usr) + float(sys_))
    loads.append(float(load))
print(f"\n{reps} repetitions x {runtime} s per run, on {target}{pinned}; "
      f"1-min load average at the start of each run: {min(loads):.1f}-{max(loads):.1f} "
      f"(median {st.median(loads):.1f})\n")
variants = [t for t in tools if not t.startswith("fio")]
ref = "legacy" if "legacy" in variants else None
head = "| workload | tool | IOPS (median) | MiB/s (median) | ratio to fio (median of per-rep ratios) [min, max] |"
sep = "|---|---|---:|---:|---:|"
if ref:
    head += f" ratio to {ref} [min, max] |"
    sep += "---:|"
head += " CPU µs per I/O (median) |"
sep += "---:|"
print(head)
print(sep)
def rng(xs):
    return f"{st.median(xs):.3f} [{min(xs):.2f}, {max(xs):.2f}]"
for name, per in rows.items():
    for tool in tools:
        reps_ = [r for r in per.values() if tool in r and "fio" in r]
        if not reps_:
            continue
        v = [r[tool] for r in reps_]
        cpu = st.median(1e6 * x[3] / x[2] for x in v if x[2] > 0)
        line = f"| {name} | {tool} | {st.median(x[0] for x in v):.0f} | {st.median(x[1] for x in v)/2**20:.1f} | "
        line += "—" if tool == "fio" else rng([r[tool][0] / r["fio"][0] for r in reps_])
        if ref:
            line += " | " + ("—" if tool in ("fio", ref) else rng([r[tool][0] / r[ref][0] for r in reps_ if ref in r]))
        line += f" | {cpu:.1f} |"
        print(line)
PY
echo "raw results: $results" >&2
