//! The integration tests of the remem binary, in one test binary (one link instead of one
//! per file): each file of this directory is a module, named as its file; the helpers they
//! share are `common` and the `*_support` modules (they allow dead code: every module uses a
//! part of them). Run one file's tests with
//! `cargo nextest run -p remem --test integration -E 'test(/^kv::/)'` (or `cargo test -p
//! remem --test integration kv::`).

#[allow(dead_code)] // every module uses a part of the shared helpers
mod common;
#[path = "common/etcd.rs"]
mod etcd_support;
#[path = "common/fs.rs"]
#[allow(dead_code)]
mod fs_support;
#[path = "common/kv_crash.rs"]
mod kv_crash;
#[path = "common/kv.rs"]
mod kv_support;
#[path = "common/netns.rs"]
#[allow(dead_code)]
mod netns_support;

mod cluster;
mod commands;
mod encrypt;
mod engine_drivers;
mod engine_faults;
mod etcd;
mod faults;
mod front_ends_shm;
mod fs;
mod fs_bench;
mod fs_host_loss;
mod fs_mounts;
mod fs_posix;
mod fs_writeback;
mod guardrails;
mod kv;
mod kv_bounds;
mod kv_conformance;
mod kv_etcd;
mod kv_etcd_standby;
mod kv_etcd_standby_netns;
mod kv_memory;
mod kv_restart;
mod kv_schemes;
mod kv_standby;
mod kv_trust;
mod leases;
mod metrics;
mod nbd;
mod nbd_engines;
mod netns;
mod netns_etcd;
mod operations;
mod paging;
mod resource_monitor;
mod run;
mod scale;
mod security;
mod security_limits;
mod security_tls;
mod shm;
mod sim;
mod sim_years;
mod stall_then_kills;
mod start_degraded;
mod status;
mod swap;
