//! remem-simnet: simulated memory nodes and a seeded network with simulated time, speaking the
//! real remem wire protocol (docs/PROTOCOL.md) as bytes, so that the client's sans-I/O engine can
//! be run against a whole cluster deterministically: thousands of seeded runs in seconds, and a
//! failing seed replays exactly. The idea is TigerBeetle's packet simulator and VOPR; the code is
//! our own.
//!
//! # Model
//!
//! - **Time** is a `u64` of nanoseconds ([`SimTime`]) that only the caller advances: every call
//!   that takes `now` first runs everything due up to `now`, and `now` never goes backwards.
//! - **The network** carries each `send` as one message with a random one-way delay
//!   (`NetworkOptions::latency_ns` ± `jitter_ns`, plus a straggler node's extra delay on its
//!   replies). One connection is a TCP stream: its messages arrive in the order they were sent,
//!   in each direction. Messages of different connections interleave by their delays, which is
//!   where reordering comes from.
//! - **A node** ([`SimCluster::add_node`]) serves every complete frame of what arrived, in order,
//!   and answers all of them in one message, as the real node answers a `read` with one `write`.
//!   It *is* the real node's core (`remem_node::core`: slab table, ownership, capacity, refusals,
//!   rebuild admission; slabs on the heap), driven frame by frame as the threaded node drives it;
//!   this crate has no model of the node. Admitted rebuilds (`Regenerate`) are the real node's
//!   rebuild machine (`remem_node::core::RebuildSteps`: which sources, each split's verdict, each
//!   page's version, what is stored), answered from the other simulated nodes' slabs through
//!   their cores instead of over sockets.
//! - **Faults** are calls at a given time: kill, restart empty, stall (SIGSTOP), partition,
//!   straggler delay, bit flips, eviction, dropped writes and a client crash with its in-flight
//!   messages delivered, dropped or each at random. [`FaultSchedule`] draws seeded fault plans
//!   within and beyond a code's tolerance.
//!
//! # The client over it
//!
//! - [`SimDriver`] ([`driver`]) runs the client's sans-I/O engine (`remem_client::engine`) over a
//!   cluster, as the blocking driver runs it over sockets: submit page ops, run to a time or a
//!   condition, inject faults at times, crash the client and reopen its saved slab map.
//! - [`scenario`] is the VOPR: from one seed, a cluster, regions, a workload checked against a
//!   reference model, and a fault plan within or beyond tolerance; a failing seed prints the
//!   one-line command that replays it.
//!
//! # Driving the cluster by hand
//!
//! ```
//! use remem_proto::Control;
//! use remem_simnet::{Delivery, NetworkOptions, SimCluster};
//!
//! let mut cluster = SimCluster::new(7, NetworkOptions::default());
//! let node = cluster.add_node("rack-a".to_owned(), 4, 1 << 20);
//! let info = cluster.connect(0, node, 42).expect("a live node accepts");
//! assert_eq!(info.slabs_mapped, 0);
//! let mut frame = Vec::new();
//! Control::Ping.encode(1, &mut frame);
//! cluster.send(0, node, 42, &frame);
//! let mut out = Vec::new();
//! while let Some(at) = cluster.next_event_time() {
//!     cluster.poll(at, &mut out);
//! }
//! assert!(matches!(&out[..], [Delivery::Bytes { node: 0, .. }]));
//! ```
//!
//! # Invariants
//!
//! - **Architecture Invariant:** no threads, sockets, clocks or files, and no decision depends on
//!   hash order: collections that are iterated are `BTreeMap`s or `Vec`s, and every random choice
//!   comes from generators seeded by [`SimCluster::new`]'s seed. The same seed and the same calls
//!   give the same deliveries, byte for byte.
//! - Input from the client is untrusted exactly as on a real socket: any bytes get an `Error`
//!   frame (and, where the protocol says so, a closed connection), never a panic.
//! - The cluster knows nothing of the client: it speaks only the wire protocol of `remem-proto`,
//!   answered by the node core of `remem-node`.
//!   Only [`driver`] and [`scenario`] use the client's engine, through its public API.

mod cluster;
pub mod driver;
mod error;
mod options;
mod regeneration;
pub mod scenario;
mod schedule;

pub use cluster::{
    Delivery, FaultCounts, InFlightFate, NodeState, PartitionNotice, RegenerationReport, SimCluster, SlabInfo,
};
pub use driver::{
    AbandonedOp, Completion, DriverStats, FaultTally, PlacementPolicy, SimDriver, SimOp, SimOpKind,
};
pub use error::SimError;
pub use options::{NetworkOptions, MICROSECOND, MILLISECOND, SECOND};
pub use scenario::{run_plan, run_seed, ScenarioFailure, ScenarioPlan, ScenarioReport, Tolerance};
pub use schedule::{FaultAction, FaultSchedule, FaultScheduleOptions, ScheduledFault};

/// Simulated time in nanoseconds since the cluster was created.
pub type SimTime = u64;

#[cfg(test)]
mod tests;
