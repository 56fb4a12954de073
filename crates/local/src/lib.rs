//! remem-local: the local-cluster kit. `launcher` starts, watches and stops `remem node`
//! processes on this machine (`remem up`, `remem demo`, the benchmarks and the tests),
//! `host_memory` reads what the host can lend, `faults` injects faults into a node from outside,
//! `units` and `process` (remem-frontend's, re-exported: sizes and counts of every command,
//! and whether a recorded PID is still a `remem` process), and the measuring helpers:
//! `pattern` (page contents that name their page, to check every byte read back) and `stats`
//! (latency samples and their percentiles, CPU seconds from /proc), and `ports` (a port to give a
//! server that must be told its own, outside the range port-0 binds draw from).
//!
//! Architecture Invariant: the kit runs the `remem` binary it is given (never links a node into
//! its own process) and knows nothing of the front ends; the cli crate depends on it, never the
//! other way round.

pub mod faults;
pub mod host_memory;
pub mod launcher;
pub mod pattern;
pub mod ports;
pub mod stats;
// The size and count parsers are remem-frontend's; here under the path they always had.
pub use remem_frontend::{process, units};
