//! The `remem` command line: node daemon, local cluster, demo and benchmarks.
//!
//! The binary (`main.rs`) only parses arguments; each command lives in its own module so the
//! tests can drive the same code.

pub mod bench;
pub mod codec_bench;
pub mod demo;
pub mod launcher;
pub mod node;
pub mod pattern;
pub mod plot;
pub mod stats;
pub mod units;
