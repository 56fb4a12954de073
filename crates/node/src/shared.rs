//! The state every thread of a node shares: its identity and configuration, the slab table, the
//! open connections, fault settings, the running rebuilds and the resource monitor's pending
//! questions, plus the two actions that span them (the node's self-description for
//! `NodeInfoReply`, and evicting a slab).
//!
//! Connections, rebuilds and the monitor each hold an `Arc<Shared>`; none of them owns the
//! others, so this module is where they meet instead of importing each other.
//!
//! Invariants: one `Shared` per node, built by `Node::bind` and dropped only after every
//! connection, rebuild and monitor thread has been joined. Its fields are either fixed at bind
//! or synchronize themselves (atomics, or the locks inside the table, peers and registries):
//! `Shared` has no lock of its own. An eviction tells the owner's connections before it unmaps
//! the slab.

use crate::fault::Faults;
use crate::leases::Leases;
use crate::monitor::ActivityAnswers;
use crate::peers::Peers;
use crate::regenerate::Regenerations;
use crate::slab::{SlabError, SlabLabel, SlabTable};
use remem_proto::auth::Secret;
use remem_proto::{Control, NodeInfo, HEADER_BYTES};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// State shared by all connections and rebuilds of a node.
pub struct Shared {
    pub node_id: u64,
    pub secret: Secret,
    pub capacity_bytes: u64,
    pub slab_size_bytes: u64,
    pub failure_domain: String,
    pub table: SlabTable,
    pub requests_served: AtomicU64,
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
    /// Which session holds each client id, and the grace periods of those that left.
    pub leases: Leases,
    /// Slabs freed because their client's lease expired, since start.
    pub slabs_freed_by_expiry: AtomicU64,
}

impl Shared {
    /// What the node answers to `NodeInfo` now.
    pub fn node_info(&self) -> NodeInfo {
        let stats = self.table.stats();
        let progress = self.regenerations.progress();
        // What a MapSlab could take now: pooled slabs are free for clients, and a host below its
        // headroom (resource monitor) lends no fresh memory.
        let capacity_free_bytes = self.capacity_bytes - stats.used_bytes + stats.pooled_bytes;
        let free_bytes = match stats.host_budget_bytes {
            Some(budget_bytes) => capacity_free_bytes.min(stats.pooled_bytes.saturating_add(budget_bytes)),
            None => capacity_free_bytes,
        };
        let leases = self.leases.counts();
        let in_grace = self.leases.in_grace();
        let slabs_in_grace =
            in_grace.iter().map(|&client_id| self.table.owned_by(client_id).len() as u32).sum();
        NodeInfo {
            clients_live: leases.live,
            clients_in_grace: leases.in_grace,
            slabs_in_grace,
            node_id: self.node_id,
            capacity_bytes: self.capacity_bytes,
            free_bytes,
            slab_size_bytes: self.slab_size_bytes,
            slabs_mapped: stats.slabs_mapped,
            metadata_bytes: stats.metadata_bytes,
            requests_served: self.requests_served.load(Ordering::Relaxed),
            regenerating_slabs: progress.regenerating_slabs,
            regeneration_pages_done: progress.pages_done,
            regeneration_pages_total: progress.pages_total,
            failure_domain: self.failure_domain.clone(),
        }
    }

    /// Frees the slabs of every client whose lease lapsed more than the grace period ago.
    /// Nobody is connected as those clients (session 0 tools aside), so nobody is told.
    pub fn expire_leases(&self, now: std::time::Instant) {
        let grace = self.leases.grace();
        let has_slabs = |client_id| !self.table.owned_by(client_id).is_empty();
        self.leases.expire(now, has_slabs, |client_id| {
            let slabs = self.table.owned_by(client_id);
            let freed = slabs.iter().filter(|&&slab_id| self.table.evict(slab_id).is_ok()).count();
            self.slabs_freed_by_expiry.fetch_add(freed as u64, Ordering::Relaxed);
            tracing::warn!(
                client_id,
                slabs = freed,
                grace_secs = grace.as_secs_f64(),
                "client lease expired: its slabs are freed (no process re-attached within the grace period)"
            );
        });
    }

    /// Evicts slab `slab_id`, whoever owns it: first sends `SlabEvicted` to every connection of
    /// the owner on this node (but `skip_connection`, whose caller tells it itself), then unmaps
    /// the slab. A rebuild filling it stops at its next batch. This is the eviction the fault
    /// command and the resource monitor (`monitor`) use.
    ///
    /// Errors: `UnknownSlab` if no such slab is mapped (or it went away meanwhile).
    pub fn evict_slab(&self, slab_id: u32, skip_connection: Option<u64>) -> Result<SlabLabel, SlabError> {
        let slab = self.table.get_any(slab_id)?;
        let owner = slab.owner_client_id();
        let mut notice = Vec::with_capacity(HEADER_BYTES + 4);
        Control::SlabEvicted { slab_id }.encode(0, &mut notice);
        let mut told = 0;
        for (_, peer) in self.peers.of_client(owner, skip_connection) {
            told += usize::from(peer.send_frames(&notice));
        }
        let label = self.table.evict(slab_id)?.label();
        tracing::warn!(
            slab_id,
            client_id = owner,
            split_index = label.split_index,
            first_page = label.first_page,
            range_id = label.range_id,
            connections_told = told,
            "slab evicted"
        );
        Ok(label)
    }
}
