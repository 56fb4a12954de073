//! The state every thread of a node shares: the node core (`core`: identity, slab table, leases,
//! rebuild admission), the open connections, fault settings, the running rebuilds' threads and the
//! resource monitor's pending questions, plus the one action that spans the core and the
//! connections (evicting a slab: its owner's connections are told first).
//!
//! Connections, rebuilds and the monitor each hold an `Arc<Shared>`; none of them owns the
//! others, so this module is where they meet instead of importing each other.
//!
//! Invariants: one `Shared` per node, built by `Node::bind` and dropped only after every
//! connection, rebuild and monitor thread has been joined. Its fields are either fixed at bind
//! or synchronize themselves (atomics, or the locks inside the table, peers and registries):
//! `Shared` has no lock of its own. An eviction tells the owner's connections before it unmaps
//! the slab.

use crate::core::{NodeCore, SlabError, SlabLabel};
use crate::fault::Faults;
use crate::monitor::ActivityAnswers;
use crate::peers::Peers;
use crate::regenerate::Regenerations;
use remem_proto::auth::Secret;
use remem_proto::{Control, HEADER_BYTES};
use std::sync::atomic::AtomicBool;

/// State shared by all connections and rebuilds of a node.
pub struct Shared {
    /// Everything the node decides (sans I/O).
    pub core: NodeCore,
    pub secret: Secret,
    /// TCP connections must encrypt (`--encrypt`), and so do this node's own connections to
    /// rebuild sources (`connection::encrypted`, `regenerate::sources`).
    pub encrypt: bool,
    pub peers: Peers,
    pub faults: Faults,
    pub regenerations: Regenerations,
    /// Set when the node stops; rebuilds check it between batches.
    pub stopping: AtomicBool,
    /// Owners' answers to the resource monitor's `SlabActivityQuery`s.
    pub activity_answers: ActivityAnswers,
    /// Authenticated connections served at once (`--max-connections`).
    pub max_connections: usize,
    /// Connection buffers beyond the small ones, node-wide (`connection::buffers`).
    pub buffer_budget: crate::connection::BufferBudget,
}

impl Shared {
    /// Evicts slab `slab_id`, whoever owns it: first sends `SlabEvicted` to every connection of
    /// the owner on this node (but `skip_connection`, whose caller tells it itself), then unmaps
    /// the slab (`NodeCore::evict_slab`). This is the eviction the fault command and the resource
    /// monitor (`monitor`) use.
    ///
    /// Errors: `UnknownSlab` if no such slab is mapped (or it went away meanwhile).
    pub fn evict_slab(&self, slab_id: u32, skip_connection: Option<u64>) -> Result<SlabLabel, SlabError> {
        self.core.evict_slab(slab_id, |owner| {
            let mut notice = Vec::with_capacity(HEADER_BYTES + 4);
            Control::SlabEvicted { slab_id }.encode(0, &mut notice);
            let mut told = 0;
            for (_, peer) in self.peers.of_client(owner, skip_connection) {
                told += usize::from(peer.send_frames(&notice));
            }
            told
        })
    }
}
