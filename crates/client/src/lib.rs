//! remem-client: the Resilience Manager (seed 000 §3.1, §4).
//!
//! A client owns a page space of 4 KiB (or larger) pages in regions, each region with its own
//! coding shape (none, rep(n), EC(k,r)) and cut into address ranges; each range lives on k+r
//! slabs on distinct nodes. Every page is split into k data splits and r Reed-Solomon parities,
//! each with a version and an end-to-end checksum.
//!
//! - [`engine`]: every decision, sans I/O: events in (submit, a frame from a node, connection
//!   lost, a tick, membership), actions out (bytes to send, connect, disconnect, completions).
//! - [`core`]: the per-op state machines the engine runs (which splits to ask, when a page is
//!   done).
//! - [`Client`]: the blocking driver, run to completion on the caller's thread.
//! - [`PollClient`]: the poll driver, embedded in a front end's own mio loop.
//! - [`cluster`]: the cluster file written by `remem up`.
//!
//! Architecture Invariant: front ends use this crate's API only; they never speak the wire
//! protocol themselves. The engine knows no sockets, clocks or threads.

pub mod cluster;
pub mod core;
mod driver;
pub mod engine;
pub mod error;
mod shm;
mod status;

pub use crate::core::Shape;
pub use crate::driver::region_node_bytes;
pub use crate::driver::{
    query_node, Client, ClientConfig, MembershipChange, MemoryReport, NodeAddress, PageOp, PollClient,
    RegionMap, SlabMapError, SlabMapFile,
};
pub use crate::engine::{
    BesideError, NodeId, NodeStats, OpDone, Range, RegenerationStatus, RegionInfo, SlabRef, Submit,
};
pub use crate::error::{format_bytes, ConnectError, NodeMemoryNeed, PageError, UnreachableNode};
pub use crate::status::{NodeStatus, RegionHealth};
pub use remem_proto::auth::Secret;
