#!/usr/bin/env bash
# One engine against two (`remem nbd --engines N`, docs/NBD.md "Engines"): fio's nbd engine,
# 4 KiB random reads and writes at a total queue depth of 32, from one connection (qd32) and
# from two (two jobs of qd16, group reporting), against remem EC(8,2) with 1 and with 2 engines,
# over shared memory and over TCP, all exports on one 10-node local cluster. Prints IOPS, p50
# and p99 per row and the 2-engine/1-engine IOPS ratio from the same run.
#
#   scripts/bench-nbd-engines.sh [SECONDS_PER_JOB] [REGION]     # defaults: 10 s, 256M
#
# Needs: a release build (cargo build --release -p remem), fio with the nbd engine.
set -euo pipefail
cd "$(dirname "$0")/.."
runtime="${1:-10}"
region="${2:-256M}"
target="${CARGO_TARGET_DIR:-target}"
remem="$target/release/remem"
[ -x "$remem" ] || { echo "build first: cargo build --release -p remem" >&2; exit 1; }
command -v fio >/dev/null && command -v nbdinfo >/dev/null || { echo "run scripts/setup.sh" >&2; exit 1; }

work="$(mktemp -d /tmp/remem-bench-engines.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

"$remem" up --nodes 10 --capacity 1GiB --slab-size 64MiB --dir "$work/cluster" </dev/null >"$work/up.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -f "$work/cluster/cluster.json" ] && break; sleep 0.1; done
[ -f "$work/cluster/cluster.json" ] || { cat "$work/up.log"; exit 1; }

# name port engines transport
servers=("shm1 10821 1 shm" "shm2 10822 2 shm" "tcp1 10823 1 tcp" "tcp2 10824 2 tcp")
for server in "${servers[@]}"; do
  read -r name port engines transport <<<"$server"
  "$remem" nbd --cluster "$work/cluster/cluster.json" --size 512MiB --export "$name" \
    --listen "127.0.0.1:$port" -k 8 -r 2 --delta 1 --transport "$transport" --engines "$engines" \
    --state "$work/$name.slabmap" >"$work/$name.out" 2>"$work/$name.log" &
  pids+=($!)
done
for server in "${servers[@]}"; do
  read -r name port _ <<<"$server"
  for _ in $(seq 300); do nbdinfo "nbd://127.0.0.1:$port/$name" >/dev/null 2>&1 && break; sleep 0.1; done
  fio --name=fill --ioengine=nbd --uri="nbd://127.0.0.1:$port/$name" --rw=write --bs=1M \
    --size="$region" --iodepth=8 --output-format=json >/dev/null
done

for rw in randread randwrite; do
  for connections in 1 2; do
    depth=$((32 / connections))
    for server in "${servers[@]}"; do
      read -r name port _ <<<"$server"
      echo "running $name $rw ${connections}x qd$depth ..." >&2
      fio --name="$rw" --ioengine=nbd --uri="nbd://127.0.0.1:$port/$name" --rw="$rw" --bs=4k \
        --size="$region" --iodepth="$depth" --numjobs="$connections" --group_reporting \
        --time_based --runtime="$runtime" --ramp_time=1 --randrepeat=0 --output-format=json \
        >"$work/$name-$rw-$connections.json"
    done
  done
done

python3 - "$work" <<'EOF'
import json, sys, os
work = sys.argv[1]
print(f"{'job':<24}{'transport':<11}{'engines':>8}{'IOPS':>10}{'p50 us':>9}{'p99 us':>9}   {'IOPS 2/1':>8}")
for rw in ["randread", "randwrite"]:
    for connections in [1, 2]:
        for transport in ["shm", "tcp"]:
            rows = {}
            for engines in [1, 2]:
                with open(os.path.join(work, f"{transport}{engines}-{rw}-{connections}.json")) as f:
                    text = f.read()
                job = json.loads(text[text.index("{"):])["jobs"][0]
                side = job["read" if rw == "randread" else "write"]
                pct = side["clat_ns"]["percentile"]
                rows[engines] = (side["iops"], pct["50.000000"] / 1000, pct["99.000000"] / 1000)
            for engines in [1, 2]:
                iops, p50, p99 = rows[engines]
                ratio = f"{rows[2][0] / rows[1][0]:>8.2f}" if engines == 2 else ""
                label = f"{rw} {connections}x qd{32 // connections}"
                print(f"{label:<24}{transport:<11}{engines:>8}{iops:>10.0f}{p50:>9.1f}{p99:>9.1f}   {ratio}")
EOF
