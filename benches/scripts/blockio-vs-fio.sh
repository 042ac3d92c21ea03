#!/usr/bin/env bash
# blockio vs fio on the same file, in the same run: 4 KiB random writes at QD 1 and
# QD 32, and 1 MiB sequential writes. fio runs with ioengine=io_uring, direct=1; blockio
# runs through its example driver (blockio/examples/bench_write.rs), built --release.
# Runs alternate (fio first on odd repetitions, blockio first on even ones) so drift
# of a shared disk hits both; the table reports medians and median ratios.
#
#   benches/scripts/blockio-vs-fio.sh            # defaults below
#   REPS=7 RUNTIME=10 FILE=/mnt/x/bench.img benches/scripts/blockio-vs-fio.sh
#   FILE=/dev/nvme1n1 ... (a block device works too; it is overwritten!)
#
# Env: FILE (default /var/tmp/blockio-vs-fio.img, created and laid out if missing),
# SIZE (1G), RUNTIME seconds per run (5), REPS (5), SEQ_QD (32), ENGINE for blockio
# (io_uring), OUT (a directory for raw results; default a temp dir).
# Needs: fio, python3, cargo. The file system must support O_DIRECT (ext4, xfs, ...).
set -euo pipefail
cd "$(dirname "$0")/../.."

FILE=${FILE:-/var/tmp/blockio-vs-fio.img}
SIZE=${SIZE:-1G}
RUNTIME=${RUNTIME:-5}
REPS=${REPS:-5}
SEQ_QD=${SEQ_QD:-32}
ENGINE=${ENGINE:-io_uring}
OUT=${OUT:-$(mktemp -d /var/tmp/blockio-vs-fio.XXXXXX)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/fenced-target}

command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 is needed to read fio's JSON" >&2; exit 1; }

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
workloads=(
  "4k-randwrite-qd1 randwrite 4096 1"
  "4k-randwrite-qd32 randwrite 4096 32"
  "1m-write-qd$SEQ_QD write 1048576 $SEQ_QD"
)

mkdir -p "$OUT"
results=$OUT/results.tsv
: >"$results"

run_fio() { # rw bs qd
  fio --name=bench --filename="$FILE" --size="$size_bytes" --ioengine=io_uring --direct=1 \
      --rw="$1" --bs="$2" --iodepth="$3" --runtime="$RUNTIME" --time_based \
      --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; w=json.load(sys.stdin)["jobs"][0]["write"]; print(w["iops"], w["bw_bytes"])'
}

run_blockio() { # rw bs qd
  "$DRIVER" --path "$FILE" --size "$size_bytes" --engine "$ENGINE" --rw "$1" --bs "$2" \
      --qd "$3" --runtime "$RUNTIME" |
    python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["iops"], r["bw_bytes"])'
}

for ((rep = 1; rep <= REPS; rep++)); do
  for w in "${workloads[@]}"; do
    read -r name rw bs qd <<<"$w"
    if ((rep % 2)); then order=(fio blockio); else order=(blockio fio); fi
    for tool in "${order[@]}"; do
      read -r iops bw < <("run_$tool" "$rw" "$bs" "$qd")
      printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rep" "$tool" "$iops" "$bw" >>"$results"
      printf 'rep %d %-18s %-8s %10.0f IOPS %8.1f MiB/s\n' "$rep" "$name" "$tool" "$iops" \
        "$(python3 -c "print($bw/1048576)")" >&2
    done
  done
done

python3 - "$results" "$RUNTIME" "$REPS" "$FILE" <<'PY'
import sys, statistics as st
from collections import defaultdict
path, runtime, reps, target = sys.argv[1:]
rows = defaultdict(lambda: defaultdict(dict))
for line in open(path):
    name, rep, tool, iops, bw = line.split("\t")
    rows[name][int(rep)][tool] = (float(iops), float(bw))
print(f"\n{reps} repetitions x {runtime} s per run, on {target}\n")
print("| workload | fio IOPS (median) | blockio IOPS (median) | ratio blockio/fio (median of per-rep ratios) | fio MiB/s | blockio MiB/s |")
print("|---|---:|---:|---:|---:|---:|")
for name, per in rows.items():
    f = [v["fio"] for v in per.values()]
    b = [v["blockio"] for v in per.values()]
    ratios = [v["blockio"][0] / v["fio"][0] for v in per.values()]
    print(f"| {name} | {st.median(x[0] for x in f):.0f} | {st.median(x[0] for x in b):.0f} "
          f"| {st.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}) "
          f"| {st.median(x[1] for x in f)/2**20:.1f} | {st.median(x[1] for x in b)/2**20:.1f} |")
PY
echo "raw results: $results" >&2
