//! remem-client: the Resilience Manager (seed 000 §3.1, §4).
//!
//! A client owns one remote address space of 4 KiB (or larger) pages, cut into address ranges;
//! each range lives on k+r slabs on distinct nodes. Every page is split into k data splits and
//! r Reed-Solomon parities, each with a version and an end-to-end checksum.
//!
//! - [`core`]: the decision logic, sans I/O (which splits to ask, when a page is done).
//! - [`io`]: the TCP driver, run to completion on the caller's thread.
//! - [`cluster`]: the cluster file written by `remem up`.
//!
//! Architecture Invariant: front ends use this crate's API only; they never speak the wire
//! protocol themselves.

pub mod cluster;
pub mod core;
pub mod error;
pub mod io;

pub use crate::core::Shape;
pub use crate::error::{ConnectError, PageError};
pub use crate::io::{
    Client, ClientConfig, MemoryReport, NodeAddress, NodeStats, OpDone, PageOp, RegenerationStatus,
    SlabMapError, SlabMapFile, SlabRef,
};
