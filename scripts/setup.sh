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
  qemu-utils libnbd-bin python3-libnbd fio e2fsprogs                   # NBD peers of crates/cli/tests/integration/nbd.rs
  prometheus                                                           # promtool and a real scrape in crates/cli/tests/integration/metrics.rs
  openssl                                                              # throwaway CA and certificates of security_tls.rs
  memcached libmemcached-tools python3-pymemcache python3-pytest       # memcached peers of crates/cli/tests/integration/kv.rs
  perl                                                                 # prove: memcached's t/ (kv_conformance.rs) and pjdfstest (fs_posix.rs)
  python3-pip                                                          # fetches pymemcache's own tests (below)
  fuse3 sqlite3                                                        # fusermount3 and sqlite3 for crates/cli/tests/integration/fs.rs (remem fs)
  python3 util-linux                                                   # jobs, losetup/mkswap/swapon of `remem run`, `remem bench apps` (tests/run.rs)
  iproute2                                                             # ip netns, bridge, veth and tc netem of crates/cli/tests/integration/netns.rs
  iputils-arping                                                       # gratuitous ARP of a moved service address (kv_etcd_standby.rs)
  groff-base                                                           # groff checks `remem man`'s pages (crates/cli/tests/integration/operations.rs)
  gcc libc6-dev                                                        # compiles the probe of crates/cli/tests/integration/paging.rs (`remem run --paging uffd`)
  etcd-server etcd-client protobuf-compiler                            # etcd for membership and slab maps (crates/cli/tests/integration/etcd.rs); protoc builds etcd-client's API
  redis-server redis-tools                                             # redis-server and redis-benchmark for `remem bench apps`
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
  if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "setup: these Debian packages are missing and installing them needs root: run" >&2
      echo "  apt-get install ${missing[*]}" >&2
      echo "as root (or install sudo), then run this again" >&2
      exit 1
    fi
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts memcached as a service on 11211 where an init system runs. The tests and
  # `remem bench kv` start their own on ephemeral ports; a stray daemon would only take memory.
  # The same for prometheus (and its node exporter), etcd and redis: tests start their own.
  # Each entry is SERVICE:PACKAGE; a service is stopped only when this run installed its package.
  for entry in memcached:memcached prometheus:prometheus prometheus-node-exporter:prometheus \
    etcd:etcd-server redis-server:redis-server; do
    service="${entry%%:*}"
    package="${entry##*:}"
    if [[ " ${missing[*]} " == *" $package "* ]]; then
      if [ -d /run/systemd/system ]; then
        $sudo systemctl disable --now "$service.service" >/dev/null 2>&1 || true
      elif command -v service >/dev/null 2>&1; then
        $sudo service "$service" stop >/dev/null 2>&1 || true
        $sudo update-rc.d "$service" disable >/dev/null 2>&1 || true
      fi
    fi
  done
fi

# pymemcache's integration tests ship in its source distribution, not in the Debian package:
# crates/cli/tests/integration/kv.rs runs them (with Debian's pytest and pymemcache) against `remem kv`.
# Fetched once into the target directory (never committed), checked against its known hash.
pymemcache_version=3.5.2 # Debian bookworm's python3-pymemcache
pymemcache_sha256=8923ab59840f0d5338f1c52dba229fa835545b91c3c2f691c118e678d0fb974e
pymemcache_dir="$(cd "$(dirname "$0")/.." && pwd)/target/pymemcache-src"
if [ ! -f "$pymemcache_dir/pymemcache-$pymemcache_version/pymemcache/test/test_integration.py" ]; then
  echo "setup: fetching pymemcache $pymemcache_version's source distribution for its integration tests" >&2
  download="$(mktemp -d)"
  # The system Python (Debian's pip), not one a pyenv or venv puts first on PATH.
  /usr/bin/python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: --no-build-isolation \
    --dest "$download" "pymemcache==$pymemcache_version"
  archive="$download/pymemcache-$pymemcache_version.tar.gz"
  echo "$pymemcache_sha256  $archive" | sha256sum --check --quiet
  mkdir -p "$pymemcache_dir"
  tar -xzf "$archive" -C "$pymemcache_dir"
  rm -rf "$download"
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest" >&2
  cargo install --locked cargo-nextest >/dev/null
fi
