#!/usr/bin/env bash
# The test command of the README: installs what the tests need, then runs every test of the
# workspace (real `remem node` processes on 127.0.0.1 included). Bounded: see .config/nextest.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# `remem bench codec` runs the ISA-L baseline binary from beside the remem binary.
cargo build -p remem-isal-baseline
cargo nextest run --workspace --no-fail-fast "$@"
