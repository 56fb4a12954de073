#!/usr/bin/env bash
# The test command of the README: installs what the tests need, then runs every test of the
# workspace (real `remem node` processes on 127.0.0.1 included). Bounded: see .config/nextest.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# `remem bench codec` runs the ISA-L baseline binary from beside the remem binary.
cargo build -p remem-isal-baseline
# `remem run --paging uffd` preloads this library from beside the remem binary; built with the
# test profile (optimized, output in target/debug too) so the pager keeps up with the programs.
cargo build --profile test -p remem-preload
cargo nextest run --workspace --no-fail-fast "$@"
