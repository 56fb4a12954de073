//! The `remem` command line: node daemon, local cluster, demo and benchmarks.
//!
//! The binary (`main.rs`) only parses arguments; each command lives in its own module so the
//! tests can drive the same code.

pub mod bench;
pub mod bench_floor;
pub mod code_args;
pub mod codec_bench;
pub mod demo;
pub mod faults;
pub mod kv_bench;
pub mod kv_command;
pub mod launcher;
pub mod memory_hog;
pub mod nbd_command;
pub mod node;
pub mod pattern;
pub mod placement_arg;
pub mod plot;
pub mod regen_bench;
pub mod sim_command;
pub(crate) mod sim_plot;
pub mod stats;
pub mod torture;
pub mod units;
