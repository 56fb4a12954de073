//! The node core: everything a memory node decides, with no sockets, threads, clocks or sleeps.
//!
//! Job: given the decoded requests of an authenticated connection (a [`Session`]), answer them as
//! the protocol says (docs/PROTOCOL.md) and change the node's state: the slab table (allocation,
//! ownership, capacity), split reads and writes, the leases that fence client ids, fault
//! injection, and the admission of rebuilds; and run each admitted rebuild's decisions
//! ([`RebuildSteps`], whose reads of other nodes the shell does). What needs the world (writing to
//! other connections, exporting a memfd, starting a rebuild, setting a reply delay) comes out as
//! an [`Effect`] for the shell to carry out. Time comes in as arguments (`Instant`s the shell
//! reads or a simulator makes up).
//!
//! Two shells run this core: the threaded node (`connection`, `regenerate`, `monitor`: sockets,
//! one thread per connection, memfd slabs) and the deterministic simulator (crates/simnet: one
//! thread, simulated time, slabs on the heap, [`Backing::Heap`]). So what the simulator finds by
//! seed is a bug of the code that ships.
//!
//! Concurrency: the threaded shell shares one `NodeCore` among its threads; the core's state is
//! the slab table (its own lock, `slab`), atomics and the lease table (its own lock). The data
//! path (a `WriteSplit`, a `ReadSplit(s)`) takes the table's lock for the lookup and nothing else
//! node-wide, as before the core existed.
//!
//! Invariants (asserted where they are kept):
//! - a slab is read and written only by the client id that mapped it, and every slot is checked
//!   against the slab before any byte moves (`session`);
//! - mapped plus pooled memory never exceeds the capacity (`slab`);
//! - at most [`MAX_CONCURRENT_REGENERATIONS`] rebuilds are admitted at once, and a slab is
//!   rebuilt by at most one (`rebuild`).

mod rebuild;
mod rebuild_steps;
mod session;
mod slab;

pub use rebuild::{Admission, RebuildProgress, MAX_CONCURRENT_REGENERATIONS};
pub use rebuild_steps::{RebuildEnd, RebuildOutcome, RebuildSteps, SourceSet, Want};
pub use session::{Effect, Served, Session, Transport};
pub use slab::{
    Backing, PooledMemory, Slab, SlabActivity, SlabError, SlabLabel, SlabTable, TableStats,
    METADATA_BYTES_PER_SLOT, POOL_SPLIT_BYTES,
};

use crate::leases::Leases;
use remem_proto::{DecodeError, ErrorCode, Kind, NodeInfo};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a core is built from.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    pub node_id: u64,
    /// Most memory mapped for slabs plus their metadata.
    pub capacity_bytes: u64,
    /// A power of two in 4 KiB..=4 GiB (the shell checks it).
    pub slab_size_bytes: u64,
    pub failure_domain: String,
    /// Accept `InjectFault`.
    pub fault_injection: bool,
    pub backing: Backing,
    pub lease_grace: Duration,
    pub lease_timeout: Duration,
}

/// Why the core refused a request; each maps to one protocol error code, and the `Display` text
/// is the `Error` frame's message.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Slab(#[from] SlabError),
    #[error("{0}")]
    Malformed(DecodeError),
    #[error("{kind:?} is not a request a node accepts")]
    NotARequest { kind: Kind },
    #[error("fault injection is off: start the node with --fault-injection")]
    NoFaultInjection,
    #[error("ExportSlab needs a Unix-socket connection")]
    NeedsUnixSocket,
    #[error("slab is being rebuilt")]
    ExportWhileRebuilding,
    #[error("regeneration code: {0}")]
    BadCode(remem_codec::ParamsError),
    #[error("code splits of {code_split_bytes} bytes, slab {slab_id} holds {split_bytes}")]
    CodeSplitSize { code_split_bytes: usize, slab_id: u32, split_bytes: u32 },
    #[error("{pages} pages, slab has {slots} slots")]
    TooManyPages { pages: u32, slots: u32 },
    #[error("slab {slab_id} holds split {split_index}, the code has {total}")]
    TargetOutsideCode { slab_id: u32, split_index: u8, total: usize },
    #[error("source split {split_index} is out of range or repeated")]
    BadSource { split_index: u8 },
    #[error("{sources} sources, at least k = {k} needed")]
    TooFewSources { sources: usize, k: usize },
    #[error("{MAX_CONCURRENT_REGENERATIONS} regenerations already running")]
    RegenerationsBusy,
    #[error("slab {slab_id} is already being rebuilt")]
    AlreadyRegenerating { slab_id: u32 },
}

impl Refusal {
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::Slab(error) => error.code(),
            Refusal::Malformed(_) => ErrorCode::Malformed,
            Refusal::TooManyPages { .. } => ErrorCode::SlotOutOfRange,
            Refusal::RegenerationsBusy => ErrorCode::NoCapacity,
            Refusal::BadCode(_) | Refusal::CodeSplitSize { .. } => ErrorCode::BadSplitSize,
            Refusal::NotARequest { .. }
            | Refusal::NoFaultInjection
            | Refusal::NeedsUnixSocket
            | Refusal::ExportWhileRebuilding
            | Refusal::TargetOutsideCode { .. }
            | Refusal::BadSource { .. }
            | Refusal::TooFewSources { .. }
            | Refusal::AlreadyRegenerating { .. } => ErrorCode::Unsupported,
        }
    }

    /// The `Error` reply that carries this refusal.
    pub fn reply(&self) -> remem_proto::Control {
        remem_proto::Control::error(self.code(), self.to_string())
    }
}

/// The state of one memory node that every connection of it shares.
pub struct NodeCore {
    pub node_id: u64,
    pub capacity_bytes: u64,
    pub slab_size_bytes: u64,
    pub failure_domain: String,
    pub fault_injection: bool,
    pub table: SlabTable,
    /// Requests served since start (every frame answered or consumed, refusals that close aside).
    pub requests_served: AtomicU64,
    /// Which session holds each client id, and the grace periods of those that left.
    pub leases: Leases,
    /// Rebuilds admitted and not yet finished, and their progress.
    pub rebuilds: RebuildProgress,
    /// Slabs freed because their client's lease expired, since start.
    pub slabs_freed_by_expiry: AtomicU64,
}

impl NodeCore {
    pub fn new(config: CoreConfig) -> NodeCore {
        assert!(config.slab_size_bytes.is_power_of_two(), "the shell validates the slab size");
        NodeCore {
            node_id: config.node_id,
            capacity_bytes: config.capacity_bytes,
            slab_size_bytes: config.slab_size_bytes,
            failure_domain: config.failure_domain,
            fault_injection: config.fault_injection,
            table: SlabTable::new(config.slab_size_bytes, config.capacity_bytes, config.backing),
            requests_served: AtomicU64::new(0),
            leases: Leases::new(config.lease_grace, config.lease_timeout),
            rebuilds: RebuildProgress::default(),
            slabs_freed_by_expiry: AtomicU64::new(0),
        }
    }

    /// What the node answers to `NodeInfo` now.
    pub fn node_info(&self) -> NodeInfo {
        let stats = self.table.stats();
        let progress = self.rebuilds.snapshot();
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

    /// Frees the slabs of every client whose lease lapsed more than the grace period before
    /// `now`. Nobody is connected as those clients (session 0 tools aside), so nobody is told.
    pub fn expire_leases(&self, now: Instant) {
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

    /// Evicts slab `slab_id` whoever owns it: calls `tell_owner(owner)` first (the shell sends
    /// `SlabEvicted` to the owner's connections), then unmaps it. A rebuild filling it stops at
    /// its next batch.
    ///
    /// Errors: `UnknownSlab` if no such slab is mapped (or it went away meanwhile).
    pub fn evict_slab(
        &self,
        slab_id: u32,
        tell_owner: impl FnOnce(u64) -> usize,
    ) -> Result<SlabLabel, SlabError> {
        let slab = self.table.get_any(slab_id)?;
        let owner = slab.owner_client_id();
        let told = tell_owner(owner);
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
