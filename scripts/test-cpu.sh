#!/usr/bin/env bash
# Runs the test suite (scripts/test.sh, with any arguments) and prints each test's wall time and
# CPU time (its own process and every process it started: nodes, peers), the heaviest first: how
# .config/nextest.toml tells the tests that compute from those that wait. Needs root and a
# cgroup-v1 cpuacct hierarchy (/sys/fs/cgroup/cpuacct); the table also goes to
# target/test-cpu.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--run-one" ]]; then
    # The target runner: one test binary invocation in a cpuacct group of its own.
    shift
    log="$1"
    shift
    group="/sys/fs/cgroup/cpuacct/remem-test-cpu-$$"
    mkdir "$group"
    echo $$ > "$group/cgroup.procs"
    started=$(date +%s%N)
    status=0
    "$@" || status=$?
    ended=$(date +%s%N)
    name=""
    for arg in "$@"; do
        case "$arg" in -*) ;; *) name="$arg" ;; esac
    done
    if [[ "$name" != "$1" && "$name" != "terse" ]]; then
        echo "$name $(( (ended - started) / 1000000 )) $(( $(cat "$group/cpuacct.usage") / 1000000 ))" >> "$log"
    fi
    echo $$ > /sys/fs/cgroup/cpuacct/cgroup.procs
    rmdir "$group" 2>/dev/null || true
    exit "$status"
fi
[[ -d /sys/fs/cgroup/cpuacct ]] || { echo "test-cpu: no cgroup-v1 cpuacct hierarchy at /sys/fs/cgroup/cpuacct" >&2; exit 1; }
log="$(pwd)/target/test-cpu.log"
mkdir -p target
: > "$log"
status=0
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$(pwd)/scripts/test-cpu.sh --run-one $log" scripts/test.sh "$@" || status=$?
{
    echo "   wall s    cpu s  cpu/wall  test"
    sort -k3 -rn "$log" | awk '{ printf "%9.1f %8.1f %9.2f  %s\n", $2 / 1000, $3 / 1000, ($2 > 0 ? $3 / $2 : 0), $1 }'
    awk '{ w += $2; c += $3 } END { printf "%9.1f %8.1f  (all %d tests)\n", w / 1000, c / 1000, NR }' "$log"
} | tee target/test-cpu.txt
exit "$status"
