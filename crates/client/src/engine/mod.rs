//! The client engine: the Resilience Manager's decisions, sans I/O.
//!
//! Events in, actions out. The engine owns everything that spans operations: the regions and
//! their ranges (each region with its own coding shape), the page-version table, the op slots,
//! node health (deadlines, heartbeats, corruption rates, failed nodes probed for readmission),
//! eviction and rebuild state, all keyed by a stable [`NodeId`]. It has no clock, no socket and
//! no thread: every event carries the time (`now`), and what it wants done comes out as
//!
//! - bytes to send to a node (whole frames, in a per-node outbox: [`Engine::outgoing`],
//!   [`Engine::mark_sent`], in the order the nodes were first queued: [`Engine::take_send_order`]);
//! - [`Action`]s: connect to a node (probe a failed one), drop a connection;
//! - completions ([`OpDone`], drained with [`Engine::take_completions`]);
//! - control replies a driver waits for ([`Engine::take_control_reply`]).
//!
//! Drivers feed it: the blocking driver (`Client`), the poll driver (`PollClient`) and the
//! simulated driver (crate remem-simnet) all run the same decisions.
//!
//! Events: [`Engine::submit`] (an op over a caller-owned buffer named by a tag),
//! [`Engine::on_frame`] (a whole frame from a node), [`Engine::connection_lost`],
//! [`Engine::node_connected`] (a probe or a new node succeeded), [`Engine::tick`] (the time
//! passed: deadlines, heartbeats, rebuilds, probes) and the membership calls
//! ([`Engine::add_node`], [`Engine::drain_node`], [`Engine::remove_node`]).
//!
//! Invariants:
//! - a node id is never reused: removed nodes stay in the table as `Removed`;
//! - a split is read only from a slab whose `unavailable` bit is clear; a slab being rebuilt
//!   takes writes but no reads until its rebuild reports every page back;
//! - a rebuild is a success only with `pages_lost == 0`; otherwise the new slab is dropped and
//!   the rebuild tried again later (never a slab marked available with holes);
//! - an old slab that is still reachable (corruption, drain, a stalled node) stays a rebuild
//!   source until its replacement is complete, and is released only then;
//! - per page op nothing is allocated: slots, parity buffers and event queues are sized when a
//!   region is added;
//! - every split that carries version v of a page encodes the same content: the content of the
//!   write that made v (a data-only write and the parity-only write that completes it count as
//!   one write, on the caller's word that it hands the same content to both);
//! - a parity-stale page (written data splits only, [`Submit::WriteData`]) is read from its k data
//!   splits only, and is marked unreadable as soon as one of its data slabs is lost: its parities
//!   do not hold its version, so no rebuild can bring the lost split back (`parity_stale.rs`).

mod health;
mod lazy;
mod ops;
mod parity_stale;
mod regeneration;
mod regions;
mod replies;
mod shared_memory;
mod writes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use remem_codec::{CodecParams, PageCodec};
use remem_placement::{NodeLoad, Placement};
use remem_proto::{Control, NodeInfo};

use crate::core::{Shape, SplitMask};
use crate::error::PageError;
use crate::shm::ShmSlab;

pub use health::NodeStats;
pub use lazy::RangePlacement;
pub(crate) use regeneration::failure_domain_key;
pub use regeneration::RegenerationStatus;
pub use regions::BesideError;

/// A node's identity within one client: its index in the node table, assigned when the node
/// joins and never reused (a removed node keeps its id as a tombstone).
pub type NodeId = usize;

/// Top bit of a request id: a control request, not a split of an op.
pub(crate) const CONTROL_REQUEST: u64 = 1 << 63;
/// Largest control reply body accepted (NodeInfoReply and Error are the big ones).
pub(crate) const MAX_CONTROL_BODY_BYTES: usize = 1024;
/// Most splits an op can have: k <= 16, r <= 4.
pub const MAX_SPLITS: usize = 20;
/// Page flag: discarded since its last write, reads as zeros.
pub(crate) const PAGE_DISCARDED: u8 = 1;
/// Page flag: version not known (reopened client); a read discovers it.
pub(crate) const PAGE_VERSION_UNKNOWN: u8 = 2;
/// Page flag: a discovery read found the page at one version but saw a newer one on fewer than
/// k splits (a torn write): the next write finds out the newest version again before it picks
/// its own, so it never reuses that number.
pub(crate) const PAGE_WRITE_DISCOVERS: u8 = 8;
/// Page flag: no read can return it until it is written again (counted in its range's
/// `unreadable_pages`).
pub(crate) const PAGE_UNREADABLE: u8 = 4;
/// Page flag: its data splits hold its current version and its parities do not (written by
/// [`Submit::WriteData`], not yet completed by [`Submit::WriteParity`]); counted in its range's
/// `parity_stale_pages`.
pub(crate) const PAGE_PARITY_STALE: u8 = 16;
/// Page flag: its range has no slabs yet (lazy ranges, `lazy.rs`): no op may start on it. Set
/// alone: an unmapped page has no other state.
pub(crate) const PAGE_UNMAPPED: u8 = 32;
/// Page flag: lost before the saved map this client reopened was saved (the map lists it,
/// [`Engine::lost_page_runs`]): while its version is unknown, a discovery that finds no version
/// anywhere reads it as lost, not as never written (its slabs were replaced by empty ones). A
/// write that lands clears it.
pub(crate) const PAGE_ABSENT_IS_LOST: u8 = 64;

/// Settings of the engine (the decision part of [`crate::ClientConfig`]).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub client_id: u64,
    pub page_bytes: usize,
    /// Op slots: most ops in flight at once.
    pub max_in_flight: usize,
    /// A node that leaves a request unanswered this long is treated as failed.
    pub request_timeout: Duration,
    /// Above this corrupt-split rate a node is suspect: reads of its ranges ask one more split.
    pub error_correction_limit: f64,
    /// Above this rate the node's slabs are rebuilt elsewhere.
    pub slab_regeneration_limit: f64,
    /// Splits read from a node before its error rate is trusted.
    pub error_rate_min_samples: u64,
    /// Rebuild lost, evicted or corrupt slabs in the background.
    pub regenerate: bool,
    /// A node that sent nothing for this long is pinged (so an idle client notices a hung node).
    pub heartbeat_interval: Duration,
    /// A failed node is probed (reconnected) this often, to be readmitted when it answers.
    pub probe_interval: Duration,
    /// A rebuilt slab may go to a failure domain that already holds r splits of its range when
    /// no other node can take it (`ClientConfig::allow_shared_domains`). Without it, such a
    /// slab stays unrebuilt until a node in another domain can take it.
    pub allow_shared_domains: bool,
}

impl EngineConfig {
    pub fn new(client_id: u64, page_bytes: usize) -> EngineConfig {
        EngineConfig {
            client_id,
            page_bytes,
            max_in_flight: 32,
            request_timeout: Duration::from_secs(2),
            error_correction_limit: 0.001,
            slab_regeneration_limit: 0.01,
            error_rate_min_samples: 256,
            regenerate: true,
            heartbeat_interval: Duration::from_secs(1),
            probe_interval: Duration::from_secs(1),
            allow_shared_domains: false,
        }
    }
}

/// One slab of a range: which node, which slab id there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabRef {
    pub node: NodeId,
    pub slab_id: u32,
}

/// An address range: `pages_per_range` consecutive pages of one region on k+r slabs.
#[derive(Clone, Debug)]
pub struct Range {
    pub region: usize,
    pub slabs: Vec<SlabRef>,
    /// Splits whose slab is known to be down (or being rebuilt): never read.
    pub unavailable: SplitMask,
    /// Splits whose slab is being rebuilt on a new node: `slabs` already names the new slab,
    /// which takes writes (they win over the rebuild) but no reads until the rebuild is done.
    pub rebuilding: SplitMask,
    /// Pages of this range that no read can return (their last write stored fewer than k
    /// splits, or discovery found no version with k, or a data slab of a parity-stale page was
    /// lost): a rebuild may lose these and no others.
    pub unreadable_pages: u64,
    /// Pages of this range whose parities are stale (written data splits only).
    pub parity_stale_pages: u64,
    /// Splits being replaced whose old slab is still read (a node that corrupts, a drained
    /// node): until the new slab is complete, reads go to the old one, where stale and corrupt
    /// splits are erasures like any other.
    pub previous: SplitMask,
    /// Unavailable splits that missed a write: a write of the range ended (stored, degraded or
    /// failed) while they were unavailable. A split that missed none holds what it held when it
    /// went away, so its node coming back (same life) makes it available again without a
    /// rebuild (`health.rs`).
    pub missed: SplitMask,
}

/// A region: consecutive pages of the client's page space with one coding shape.
pub struct Region {
    pub shape: Shape,
    pub first_page: u64,
    pub page_count: u64,
    pub first_range: usize,
    pub range_count: usize,
    pub pages_per_range: u64,
    pub split_bytes: usize,
    /// The region and split this one is laid beside ([`Engine::nodes_beside`]), kept for its
    /// ranges mapped later.
    beside: Option<(usize, usize)>,
    codec: Box<dyn PageCodec>,
}

impl Region {
    pub fn params(&self, page_bytes: usize) -> CodecParams {
        CodecParams::new(self.shape.data_splits, self.shape.parity_splits, page_bytes)
            .expect("a region's shape was checked when it was added")
    }
}

/// Where a region lives in the client's page space: pages `first_page..first_page + page_count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    pub index: usize,
    pub shape: Shape,
    pub first_page: u64,
    pub page_count: u64,
    pub pages_per_range: u64,
}

/// Membership of a node in this client's view of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    /// Takes new slabs.
    Member,
    /// Its slabs are being rebuilt elsewhere; takes no new slabs.
    Draining,
    /// Gone for good: never probed, never placed on.
    Removed,
}

/// What the engine knows of one node.
#[derive(Debug)]
pub struct NodeEntry {
    pub address: SocketAddr,
    pub unix_socket: Option<PathBuf>,
    pub info: NodeInfo,
    pub membership: Membership,
    /// A live connection the engine may send on.
    pub connected: bool,
    pub stats: NodeStats,
    out: Vec<u8>,
    out_sent: usize,
    queued: bool,
    /// When the node last sent anything (a heartbeat is due after `heartbeat_interval`).
    last_heard: Instant,
    ping_sent: Option<Instant>,
    /// Not connected: when to probe it next.
    next_probe: Instant,
    /// Our slabs on this node that no range names any more (replaced while the node was
    /// unreachable): released when it is reachable again.
    orphans: Vec<u32>,
}

impl NodeEntry {
    fn new(address: SocketAddr, unix_socket: Option<PathBuf>, info: NodeInfo, now: Instant) -> NodeEntry {
        NodeEntry {
            address,
            unix_socket,
            info,
            membership: Membership::Member,
            connected: true,
            stats: NodeStats::default(),
            out: Vec::with_capacity(64 * 1024),
            out_sent: 0,
            queued: false,
            last_heard: now,
            ping_sent: None,
            next_probe: now,
            orphans: Vec::new(),
        }
    }

    /// The node's load for placing a slab of splits of `split_bytes`.
    fn load(&self, node_index: NodeId, split_bytes: usize) -> NodeLoad {
        NodeLoad {
            node_index,
            failure_domain: self.info.failure_domain.clone(),
            slabs_mapped: self.info.slabs_mapped as u64,
            slabs_free: self.info.free_bytes / slab_footprint_bytes(self.info.slab_size_bytes, split_bytes),
        }
    }
}

/// What one slab of splits of `split_bytes` takes of a node's capacity: the slab and its
/// metadata (a version and a checksum per split, page-rounded), as the node counts it. Placement
/// counting the slab alone would see one slab more on a node whose capacity is a multiple of the
/// slab size, and have its map refused.
pub fn slab_footprint_bytes(slab_size_bytes: u64, split_bytes: usize) -> u64 {
    let layout = u32::try_from(split_bytes)
        .ok()
        .and_then(|split| remem_proto::shm::ShmLayout::new(slab_size_bytes, split));
    layout.map_or(slab_size_bytes, |layout| layout.total_bytes).max(1)
}

/// What the engine asks its driver to do besides sending bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Open a connection to this node (a new node, or a failed one being probed), then call
    /// [`Engine::node_connected`] or [`Engine::connection_lost`].
    Connect { node: NodeId },
    /// Close the connection: the engine has declared the node failed or removed it.
    Disconnect { node: NodeId },
}

/// What an op reports when it completes.
#[derive(Debug)]
pub struct OpDone {
    /// The caller's tag of the op (its index in a batch for [`crate::Client::execute`]).
    pub index: usize,
    pub result: Result<(), PageError>,
    /// From the moment the op was started to its completion, by the engine's clock (the times
    /// of the events that started and completed it). An op completed within the event that
    /// started it (shared memory) shows zero: drivers that measure wall time use `started`.
    pub latency: Duration,
    /// When the op was started (the `now` of its submit).
    pub started: Instant,
    /// True when the read had to decode (a data split was missing or late).
    pub decoded: bool,
    /// True when the read decoded because a data split was missing: its slab is down, or it
    /// answered failed, corrupt, or of another version. Not when a data split was merely later
    /// than a parity (a read that asks k + delta splits on a healthy cluster): that read is
    /// `decoded` only, as is one that raced a node's death before the client knew of it. What a
    /// "degraded reads" count should count.
    pub degraded: bool,
}

/// The buffers of ops in flight, owned by the caller and named by the op's tag: the engine
/// copies arriving splits straight into a read's page.
pub trait OpBuffers {
    /// The page buffer of the read op with this tag.
    fn read_buffer(&mut self, tag: usize) -> &mut [u8];
}

/// No buffers: for loops that run no reads (background work, control calls).
pub struct NoBuffers;

impl OpBuffers for NoBuffers {
    fn read_buffer(&mut self, tag: usize) -> &mut [u8] {
        unreachable!("op {tag} is a read but no buffers were given")
    }
}

/// An op given to [`Engine::submit`].
#[derive(Clone, Copy, Debug)]
pub enum Submit<'a> {
    /// The next version of the page on every split: k data splits and r parities.
    Write {
        page: u64,
        data: &'a [u8],
    },
    /// The next version of the page on its k data splits only: no parity is encoded or sent,
    /// and the page becomes parity-stale (EC-oriented replication, seed 003 §4.2: the object's
    /// main copy lives elsewhere). Succeeds when every data split is stored; a data slab that
    /// is unavailable and not being rebuilt fails it with `WriteFailed` before anything is sent.
    /// Reads of a parity-stale page ask only its data splits and fail (`Lost`) if one is
    /// missing. For a shape without parities it is a `Write`.
    WriteData {
        page: u64,
        data: &'a [u8],
    },
    /// Completes a parity-stale page: encodes `data` and writes the r parities at the page's
    /// current version (no new version). `data` must be exactly what the data splits hold (the
    /// content of the last `WriteData`): the engine cannot check it, and a parity of other
    /// content at the same version would be decoded with the data splits into wrong bytes.
    /// Succeeds when every parity was stored or its slab is down and waiting for a rebuild
    /// (which computes it from the data splits); the page is then an ordinary one. Errors:
    /// `NotParityStale` (nothing sent) for a page that is not parity-stale; `ParityStaleLost`
    /// (nothing sent, or the page stays parity-stale) when a data split may be lost or the
    /// version is unknown: write the page whole instead; `WriteFailed` when a parity could not
    /// be stored on an available slab (the page stays parity-stale).
    WriteParity {
        page: u64,
        data: &'a [u8],
    },
    Read {
        page: u64,
    },
    /// A raw fan-out of a prepared probe (the transport floor of `remem bench pages`).
    Probe {
        probe: usize,
    },
}

/// A raw fan-out: `targets.len()` one-split reads, done at the `need`-th reply.
#[derive(Clone, Debug)]
pub struct Probe {
    pub targets: Vec<(NodeId, u32)>,
    pub need: usize,
}

/// The engine. Not `Sync`: one thread drives it; use one engine per core.
pub struct Engine {
    config: EngineConfig,
    now: Instant,
    nodes: Vec<NodeEntry>,
    regions: Vec<Region>,
    ranges: Vec<Range>,
    versions: Vec<u8>,
    /// Per page: [`PAGE_DISCARDED`], [`PAGE_VERSION_UNKNOWN`], [`PAGE_UNREADABLE`],
    /// [`PAGE_WRITE_DISCOVERS`], [`PAGE_PARITY_STALE`].
    page_flags: Vec<u8>,
    slots: Vec<ops::OpSlot>,
    /// Per slot, the page of its read or write ([`ops::NO_PAGE`] if none), and the free slots:
    /// what every submit looks at, kept small (the slots themselves are a few cache lines each).
    slot_pages: Vec<u64>,
    /// Per slot, its op's deadline (`None` while free): apart from the slots, so that
    /// `next_deadline`, which every driver calls each turn, reads 16 bytes a slot, not a slot's
    /// cache lines.
    slot_deadlines: Vec<Option<Instant>>,
    free_slots: Vec<usize>,
    active: usize,
    events: Vec<ops::SplitEvent>,
    completions: Vec<OpDone>,
    actions: Vec<Action>,
    control_replies: Vec<(NodeId, u64, Control)>,
    /// Control requests a driver waits for; replies to others are dropped.
    awaited_replies: Vec<u64>,
    control_counter: u64,
    send_order: Vec<NodeId>,
    probes: Vec<Probe>,
    regenerations: Vec<regeneration::Regeneration>,
    regenerations_done: u64,
    /// Every page's version is known exactly (no region was reopened from a saved map): a split
    /// that missed writes can only carry an older version, never a reused one.
    versions_exact: bool,
    /// `MapSlab` requests whose node failed before answering (see `regeneration_node_died`).
    maps_abandoned: u64,
    placement: Box<dyn Placement>,
    /// Per (range, split), at `range * MAX_SPLITS + split`: the slab's shared mapping, if
    /// exported. Empty unless shared memory is in use.
    shm: Vec<Option<ShmSlab>>,
    shm_in_use: bool,
    /// The page the caller will read next, if it said so: its shared-memory lines are
    /// prefetched while the current read is checksummed (`hint_next_read`).
    next_read: Option<u64>,
    /// (range, split) of slabs rebuilt on a node with a Unix socket, to export between batches.
    pending_exports: Vec<(usize, usize)>,
    /// Per range: page operations started on it, ever (what `SlabActivity` answers).
    range_accesses: Vec<u64>,
    /// (range, split, old slab) of every bit set in a range's `previous`.
    previous_slabs: Vec<(usize, usize, SlabRef)>,
    /// Scratch of `expire_deadlines`, one flag per node (no bound on the node count).
    hung: Vec<bool>,
}

impl Engine {
    /// An engine with no nodes and no regions yet.
    pub fn new(config: EngineConfig, placement: Box<dyn Placement>, now: Instant) -> Engine {
        assert!(config.max_in_flight >= 1 && config.max_in_flight < (1 << 24));
        let slots = (0..config.max_in_flight).map(|_| ops::OpSlot::new(now, config.page_bytes)).collect();
        let slot_pages = vec![ops::NO_PAGE; config.max_in_flight];
        let slot_deadlines = vec![None; config.max_in_flight];
        let free_slots = (0..config.max_in_flight).rev().collect();
        Engine {
            events: Vec::with_capacity(config.max_in_flight * MAX_SPLITS * 2),
            completions: Vec::with_capacity(config.max_in_flight),
            config,
            now,
            nodes: Vec::new(),
            regions: Vec::new(),
            ranges: Vec::new(),
            versions: Vec::new(),
            page_flags: Vec::new(),
            slots,
            slot_pages,
            slot_deadlines,
            free_slots,
            active: 0,
            actions: Vec::new(),
            control_replies: Vec::new(),
            awaited_replies: Vec::new(),
            control_counter: 0,
            send_order: Vec::new(),
            probes: Vec::new(),
            regenerations: Vec::new(),
            regenerations_done: 0,
            maps_abandoned: 0,
            versions_exact: true,
            placement,
            shm: Vec::new(),
            shm_in_use: false,
            next_read: None,
            pending_exports: Vec::new(),
            range_accesses: Vec::new(),
            previous_slabs: Vec::new(),
            hung: Vec::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    // ---- membership -------------------------------------------------------------------------

    /// A node joins (at connect, or at run time): it gets the next id and becomes a candidate
    /// for new and rebuilt slabs. `connected` says whether the driver already holds a live
    /// connection to it; if not, it is probed.
    pub fn add_node(
        &mut self,
        now: Instant,
        address: SocketAddr,
        unix_socket: Option<PathBuf>,
        info: NodeInfo,
        connected: bool,
    ) -> NodeId {
        self.now = now;
        let mut entry = NodeEntry::new(address, unix_socket, info, now);
        entry.connected = connected;
        self.nodes.push(entry);
        self.hung.push(false);
        self.nodes.len() - 1
    }

    /// Drains a node: every slab of ours on it is rebuilt elsewhere (the old slab stays a source
    /// until its replacement is complete, then it is released) and it takes no new slabs.
    pub fn drain_node(&mut self, now: Instant, node: NodeId) {
        self.now = now;
        if self.nodes[node].membership != Membership::Member {
            return;
        }
        self.nodes[node].membership = Membership::Draining;
        for range in 0..self.ranges.len() {
            for split in 0..self.ranges[range].slabs.len() {
                if self.ranges[range].slabs[split].node == node {
                    self.schedule_regeneration(range, split, "node drained", true);
                }
            }
        }
    }

    /// Removes a node for good (it failed and will not come back): its connection is dropped,
    /// its slabs are rebuilt elsewhere, and it is never probed again.
    pub fn remove_node(&mut self, now: Instant, node: NodeId) {
        self.now = now;
        if self.nodes[node].membership == Membership::Removed {
            return;
        }
        self.node_failed(node, "node removed");
        self.nodes[node].membership = Membership::Removed;
        self.nodes[node].orphans.clear();
    }

    // ---- output -----------------------------------------------------------------------------

    /// Bytes queued for `node` and not yet sent.
    pub fn outgoing(&self, node: NodeId) -> &[u8] {
        let entry = &self.nodes[node];
        &entry.out[entry.out_sent..]
    }

    /// The driver sent `bytes` of [`Engine::outgoing`].
    pub fn mark_sent(&mut self, node: NodeId, bytes: usize) {
        let entry = &mut self.nodes[node];
        entry.out_sent += bytes;
        assert!(entry.out_sent <= entry.out.len());
        if entry.out_sent == entry.out.len() {
            entry.out.clear();
            entry.out_sent = 0;
        }
    }

    /// Nodes with bytes to send, in the order their first frame was queued (a read's data splits
    /// leave before its extra parity, so a healthy cluster rarely decodes). The driver hands the
    /// vector back with [`Engine::return_send_order`] to keep it allocated.
    pub fn take_send_order(&mut self) -> Vec<NodeId> {
        let order = std::mem::take(&mut self.send_order);
        for &node in &order {
            self.nodes[node].queued = false;
        }
        order
    }

    pub fn return_send_order(&mut self, mut order: Vec<NodeId>) {
        order.clear();
        if self.send_order.is_empty() {
            self.send_order = order;
        }
    }

    pub fn take_actions(&mut self) -> std::vec::Drain<'_, Action> {
        self.actions.drain(..)
    }

    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    pub fn take_completions(&mut self) -> std::vec::Drain<'_, OpDone> {
        self.completions.drain(..)
    }

    /// The reply to control request `request_id`, if it arrived.
    pub fn take_control_reply(&mut self, request_id: u64) -> Option<(NodeId, Control)> {
        let index = self.control_replies.iter().position(|(_, id, _)| *id == request_id)?;
        let (node, _, reply) = self.control_replies.swap_remove(index);
        Some((node, reply))
    }

    /// Queues a control request to `node`; its reply comes back through
    /// [`Engine::take_control_reply`]. `None` if the node is not connected.
    pub fn queue_control(&mut self, node: NodeId, message: &Control) -> Option<u64> {
        let id = self.send_control(node, message)?;
        self.awaited_replies.push(id);
        Some(id)
    }

    /// Stops waiting for the reply to `request_id` (the driver gave up on it).
    pub fn forget_control(&mut self, request_id: u64) {
        self.awaited_replies.retain(|id| *id != request_id);
        self.control_replies.retain(|(_, id, _)| *id != request_id);
    }

    /// Queues a control request whose reply nobody awaits (it is dropped when it comes).
    pub fn send_control(&mut self, node: NodeId, message: &Control) -> Option<u64> {
        if !self.nodes[node].connected {
            return None;
        }
        let id = self.next_control_id();
        message.encode(id, &mut self.nodes[node].out);
        self.mark_queued(node);
        Some(id)
    }

    fn next_control_id(&mut self) -> u64 {
        self.control_counter += 1;
        CONTROL_REQUEST | self.control_counter
    }

    /// The slab a read of split `split` of range `range` goes to: the old slab while it is
    /// being replaced and still readable, else the range's slab.
    fn read_slab(&self, range: usize, split: usize) -> SlabRef {
        if self.ranges[range].previous & (1 << split) != 0 {
            if let Some(&(_, _, old)) =
                self.previous_slabs.iter().find(|(r, s, _)| *r == range && *s == split)
            {
                return old;
            }
        }
        self.ranges[range].slabs[split]
    }

    /// The node a pending split of `slot` waits on: the one it was sent to (a range may have
    /// moved the split to another slab since).
    fn slot_split_node(&self, slot: &ops::OpSlot, split: usize) -> NodeId {
        slot.asked_nodes[split]
    }

    /// Stops reading the old slab of (range, split), if it was read.
    fn forget_previous(&mut self, range: usize, split: usize) {
        self.ranges[range].previous &= !(1 << split);
        self.previous_slabs.retain(|(r, s, _)| !(*r == range && *s == split));
    }

    /// Notes that `node` has frames to send (see [`Engine::take_send_order`]).
    fn mark_queued(&mut self, node: NodeId) {
        let entry = &mut self.nodes[node];
        if !entry.queued {
            entry.queued = true;
            self.send_order.push(node);
        }
    }

    // ---- state for drivers ------------------------------------------------------------------

    /// Ops in flight.
    pub fn active(&self) -> usize {
        self.active
    }

    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The earliest time the engine wants a [`Engine::tick`]: an op's deadline, a heartbeat, a
    /// probe, a queued rebuild.
    pub fn next_deadline(&self) -> Option<Instant> {
        let in_flight: &[Option<Instant>] = if self.active > 0 { &self.slot_deadlines } else { &[] };
        let ops = in_flight.iter().flatten().copied();
        let nodes = self.nodes.iter().filter_map(|node| self.node_deadline(node));
        let rebuilds = self.regenerations.iter().filter_map(|task| task.not_before());
        ops.chain(nodes).chain(rebuilds).min()
    }

    pub fn regeneration_status(&self) -> RegenerationStatus {
        RegenerationStatus { in_flight: self.regenerations.len(), done: self.regenerations_done }
    }

    /// Slab mappings asked of a node that failed before it answered: each may have left a slab
    /// of ours mapped there that no range names (released only by slab leases).
    pub fn maps_abandoned(&self) -> u64 {
        self.maps_abandoned
    }

    pub fn has_regenerations(&self) -> bool {
        !self.regenerations.is_empty()
    }

    pub fn node_stats(&self) -> Vec<NodeStats> {
        self.nodes.iter().map(|node| node.stats).collect()
    }

    pub fn probes(&self) -> &[Probe] {
        &self.probes
    }

    pub fn add_probe(&mut self, probe: Probe) -> usize {
        assert!(probe.need >= 1 && probe.need <= probe.targets.len() && probe.targets.len() <= MAX_SPLITS);
        self.probes.push(probe);
        self.probes.len() - 1
    }

    /// Every slab of this client (ranges, probes and orphans), emptying the engine's record of
    /// them: for a release.
    pub fn take_all_slabs(&mut self) -> Vec<(NodeId, u32)> {
        self.shm.iter_mut().for_each(|mapping| *mapping = None);
        let mut slabs: Vec<(NodeId, u32)> = Vec::new();
        for probe in self.probes.drain(..) {
            slabs.extend(probe.targets);
        }
        for range in self.ranges.drain(..) {
            slabs.extend(range.slabs.iter().map(|slab| (slab.node, slab.slab_id)));
        }
        for (node, entry) in self.nodes.iter_mut().enumerate() {
            slabs.extend(entry.orphans.drain(..).map(|slab_id| (node, slab_id)));
        }
        self.regions.clear();
        self.regenerations.clear();
        slabs
    }
}

/// What a driver tells the engine of a node it could not reach (added with `connected: false`):
/// nothing free, no domain, node id 0 (any real answer later counts as a new life).
pub fn unreachable_node_info() -> NodeInfo {
    NodeInfo {
        node_id: 0,
        capacity_bytes: 0,
        free_bytes: 0,
        slab_size_bytes: 0,
        slabs_mapped: 0,
        metadata_bytes: 0,
        requests_served: 0,
        regenerating_slabs: 0,
        regeneration_pages_done: 0,
        regeneration_pages_total: 0,
        clients_live: 0,
        clients_in_grace: 0,
        slabs_in_grace: 0,
        failure_domain: String::new(),
    }
}
