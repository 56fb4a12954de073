#!/usr/bin/env bash
# Installs what remem needs to build and test on a fresh Debian machine that has only Rust:
# the toolchain ISA-L builds with (nasm, autotools, libclang for bindgen), Debian's ISA-L for the
# codec baseline, a font for the plots, and the peer programs the tests drive.
# Safe to run again: installs only what is missing.
set -euo pipefail

packages=(
  nasm autoconf automake libtool make pkg-config libclang-dev clang  # erasure-isa-l builds ISA-L from source
  libisal-dev                                                          # baseline for `remem bench codec`
  fonts-dejavu-core                                                    # text in the PNG plots
  qemu-utils libnbd-bin python3-libnbd fio e2fsprogs                   # NBD peers of crates/cli/tests/nbd.rs
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest" >&2
  cargo install --locked cargo-nextest >/dev/null
fi
