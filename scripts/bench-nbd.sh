#!/usr/bin/env bash
# NBD benchmark: the same fio nbd-engine jobs (4 KiB random read and write, queue depth 1 and
# 32, time-based) against remem EC(8,2), remem rep(2) (k=1 r=1), remem none (k=1 r=0), each
# over TCP to the nodes, EC(8,2) and rep(2) again over shared memory (`--transport shm`), and
# qemu-nbd serving a RAM-backed file in /dev/shm: the plain NBD a user would otherwise run.
# Prints p50/p99 completion latency and IOPS, and each remem figure as a ratio to qemu-nbd's
# from the same run.
#
#   scripts/bench-nbd.sh [SECONDS_PER_JOB] [REGION]     # defaults: 10 s, 256M
#
# Needs: a release build (cargo build --release -p remem), fio with the nbd engine, qemu-nbd.
# Reads are of pages written by a fill pass first: remem answers never-written pages with
# zeros and no remote I/O, which would flatter it.
set -euo pipefail
cd "$(dirname "$0")/.."
runtime="${1:-10}"
region="${2:-256M}"
target="${CARGO_TARGET_DIR:-target}"
remem="$target/release/remem"
[ -x "$remem" ] || { echo "build first: cargo build --release -p remem" >&2; exit 1; }
command -v fio >/dev/null && command -v qemu-nbd >/dev/null || { echo "run scripts/setup.sh" >&2; exit 1; }

work="$(mktemp -d /tmp/remem-bench-nbd.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work" /dev/shm/remem-bench-nbd.img
}
trap cleanup EXIT

"$remem" up --nodes 10 --capacity 1GiB --slab-size 64MiB --dir "$work/cluster" >"$work/up.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -f "$work/cluster/cluster.json" ] && break; sleep 0.1; done
[ -f "$work/cluster/cluster.json" ] || { cat "$work/up.log"; exit 1; }

# name port k r delta transport
servers=("ec82 10811 8 2 1 tcp" "rep2 10812 1 1 0 tcp" "none 10813 1 0 0 tcp" "ec82shm 10815 8 2 1 shm"
  "rep2shm 10816 1 1 0 shm")
for server in "${servers[@]}"; do
  read -r name port k r delta transport <<<"$server"
  "$remem" nbd --cluster "$work/cluster/cluster.json" --size 1GiB --export "$name" \
    --listen "127.0.0.1:$port" -k "$k" -r "$r" --delta "$delta" --transport "$transport" \
    >"$work/$name.out" 2>"$work/$name.log" &
  pids+=($!)
done
truncate -s 1G /dev/shm/remem-bench-nbd.img
qemu-nbd -f raw -x qemu -p 10814 -b 127.0.0.1 -t --shared=8 /dev/shm/remem-bench-nbd.img 2>"$work/qemu.log" &
pids+=($!)
for server in "${servers[@]}" "qemu 10814"; do
  read -r name port _ <<<"$server"
  for _ in $(seq 300); do nbdinfo "nbd://127.0.0.1:$port/$name" >/dev/null 2>&1 && break; sleep 0.1; done
done

targets=("ec82 10811" "rep2 10812" "none 10813" "ec82shm 10815" "rep2shm 10816" "qemu 10814")
job() { # name port rw depth -> json file
  fio --name="$3-qd$4" --ioengine=nbd --uri="nbd://127.0.0.1:$2/$1" --rw="$3" --bs=4k \
    --size="$region" --iodepth="$4" --time_based --runtime="$runtime" --ramp_time=1 \
    --randrepeat=0 --output-format=json >"$work/$1-$3-qd$4.json"
}
for target_spec in "${targets[@]}"; do
  read -r name port <<<"$target_spec"
  fio --name=fill --ioengine=nbd --uri="nbd://127.0.0.1:$port/$name" --rw=write --bs=1M \
    --size="$region" --iodepth=8 --output-format=json >/dev/null
done
for rw in randread randwrite; do
  for depth in 1 32; do
    for target_spec in "${targets[@]}"; do
      read -r name port <<<"$target_spec"
      echo "running $name $rw qd$depth ..." >&2
      job "$name" "$port" "$rw" "$depth"
    done
  done
done

python3 - "$work" <<'EOF'
import json, sys, os
work = sys.argv[1]
names = ["ec82", "rep2", "none", "ec82shm", "rep2shm", "qemu"]
labels = {"ec82": "remem EC(8,2)", "rep2": "remem rep(2)", "none": "remem none",
          "ec82shm": "remem EC(8,2) shm", "rep2shm": "remem rep(2) shm", "qemu": "qemu-nbd /dev/shm"}
print(f"{'job':<16}{'server':<22}{'p50 us':>9}{'p99 us':>9}{'IOPS':>10}   {'p50/qemu':>9}{'p99/qemu':>9}{'IOPS/qemu':>10}")
for rw in ["randread", "randwrite"]:
    for depth in [1, 32]:
        rows = {}
        for name in names:
            with open(os.path.join(work, f"{name}-{rw}-qd{depth}.json")) as f:
                text = f.read()
            # fio may print notes before the JSON document.
            job = json.loads(text[text.index("{"):])["jobs"][0]
            side = job["read" if rw == "randread" else "write"]
            pct = side["clat_ns"]["percentile"]
            rows[name] = (pct["50.000000"] / 1000, pct["99.000000"] / 1000, side["iops"])
        base = rows["qemu"]
        for name in names:
            p50, p99, iops = rows[name]
            ratio = "" if name == "qemu" else f"{p50/base[0]:>9.2f}{p99/base[1]:>9.2f}{iops/base[2]:>10.2f}"
            print(f"{rw + ' qd' + str(depth):<16}{labels[name]:<22}{p50:>9.1f}{p99:>9.1f}{iops:>10.0f}   {ratio}")
EOF
