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
//!   region is added.

mod health;
mod ops;
mod regeneration;

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
pub use regeneration::RegenerationStatus;

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
/// Page flag: no read can return it until it is written again (counted in its range's
/// `unreadable_pages`).
pub(crate) const PAGE_UNREADABLE: u8 = 4;

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
    /// splits, or discovery found no version with k): a rebuild may lose these and no others.
    pub unreadable_pages: u64,
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

    fn load(&self, node_index: NodeId) -> NodeLoad {
        NodeLoad {
            node_index,
            failure_domain: self.info.failure_domain.clone(),
            slabs_mapped: self.info.slabs_mapped as u64,
            slabs_free: self.info.free_bytes / self.info.slab_size_bytes.max(1),
        }
    }
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
    /// From the moment the op was started to its completion.
    pub latency: Duration,
    /// True when the read had to decode (a data split was missing or late).
    pub decoded: bool,
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
    Write {
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
    /// Per page: [`PAGE_DISCARDED`], [`PAGE_VERSION_UNKNOWN`].
    page_flags: Vec<u8>,
    slots: Vec<ops::OpSlot>,
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
    placement: Box<dyn Placement>,
    /// Per (range, split), at `range * MAX_SPLITS + split`: the slab's shared mapping, if
    /// exported. Empty unless shared memory is in use.
    shm: Vec<Option<ShmSlab>>,
    shm_in_use: bool,
    /// (range, split) of slabs rebuilt on a node with a Unix socket, to export between batches.
    pending_exports: Vec<(usize, usize)>,
    /// Per range: page operations started on it, ever (what `SlabActivity` answers).
    range_accesses: Vec<u64>,
    /// Scratch of `expire_deadlines`, one flag per node (no bound on the node count).
    hung: Vec<bool>,
}

impl Engine {
    /// An engine with no nodes and no regions yet.
    pub fn new(config: EngineConfig, placement: Box<dyn Placement>, now: Instant) -> Engine {
        assert!(config.max_in_flight >= 1 && config.max_in_flight < (1 << 24));
        let slots = (0..config.max_in_flight).map(|_| ops::OpSlot::new(now)).collect();
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
            active: 0,
            actions: Vec::new(),
            control_replies: Vec::new(),
            awaited_replies: Vec::new(),
            control_counter: 0,
            send_order: Vec::new(),
            probes: Vec::new(),
            regenerations: Vec::new(),
            regenerations_done: 0,
            placement,
            shm: Vec::new(),
            shm_in_use: false,
            pending_exports: Vec::new(),
            range_accesses: Vec::new(),
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

    // ---- regions ----------------------------------------------------------------------------

    /// Adds a region of `page_count` pages coded with `shape` over `ranges` (already mapped by
    /// the driver, `pages_per_range` pages each). Returns where its pages are.
    pub fn add_region(
        &mut self,
        shape: Shape,
        page_count: u64,
        pages_per_range: u64,
        ranges: Vec<Vec<SlabRef>>,
        versions_known: bool,
    ) -> RegionInfo {
        let params = CodecParams::new(shape.data_splits, shape.parity_splits, self.config.page_bytes)
            .expect("the driver checked the shape");
        assert!(shape.total_splits() <= MAX_SPLITS && shape.extra_reads <= shape.parity_splits);
        assert_eq!(ranges.len() as u64, page_count.div_ceil(pages_per_range));
        let first_page = self.versions.len() as u64;
        let index = self.regions.len();
        let first_range = self.ranges.len();
        for slabs in ranges {
            assert_eq!(slabs.len(), shape.total_splits());
            self.ranges.push(Range {
                region: index,
                slabs,
                unavailable: 0,
                rebuilding: 0,
                unreadable_pages: 0,
            });
            self.range_accesses.push(0);
        }
        if !self.shm.is_empty() || self.shm_in_use {
            self.shm.resize_with(self.ranges.len() * MAX_SPLITS, || None);
        }
        let flags = if versions_known { 0 } else { PAGE_VERSION_UNKNOWN };
        self.versions.resize((first_page + page_count) as usize, 0);
        self.page_flags.resize((first_page + page_count) as usize, flags);
        for slot in &mut self.slots {
            if slot.parity.len() < params.parity_bytes() {
                slot.parity.resize(params.parity_bytes(), 0);
            }
        }
        self.regions.push(Region {
            shape,
            first_page,
            page_count,
            first_range,
            range_count: self.ranges.len() - first_range,
            pages_per_range,
            split_bytes: params.split_bytes(),
            codec: remem_codec::new_codec(params),
        });
        self.region_info(index)
    }

    pub fn region_info(&self, index: usize) -> RegionInfo {
        let region = &self.regions[index];
        RegionInfo {
            index,
            shape: region.shape,
            first_page: region.first_page,
            page_count: region.page_count,
            pages_per_range: region.pages_per_range,
        }
    }

    pub fn regions(&self) -> impl Iterator<Item = RegionInfo> + '_ {
        (0..self.regions.len()).map(|index| self.region_info(index))
    }

    /// The region holding `page`, if any.
    pub fn region_of(&self, page: u64) -> Option<usize> {
        let index = self.regions.partition_point(|region| region.first_page <= page).checked_sub(1)?;
        (page < self.regions[index].first_page + self.regions[index].page_count).then_some(index)
    }

    /// (range, slot in range) of a page of region `region`.
    fn locate(&self, region: usize, page: u64) -> (usize, u32) {
        let region = &self.regions[region];
        let local = page - region.first_page;
        (
            region.first_range + (local / region.pages_per_range) as usize,
            (local % region.pages_per_range) as u32,
        )
    }

    /// Sets or clears a page's [`PAGE_UNREADABLE`] flag, keeping its range's count.
    fn set_unreadable(&mut self, page: u64, unreadable: bool) {
        let flags = &mut self.page_flags[page as usize];
        if (*flags & PAGE_UNREADABLE != 0) == unreadable {
            return;
        }
        *flags ^= PAGE_UNREADABLE;
        let region = self.region_of(page).expect("a page of a region");
        let (range, _) = self.locate(region, page);
        if unreadable {
            self.ranges[range].unreadable_pages += 1;
        } else {
            self.ranges[range].unreadable_pages -= 1;
        }
    }

    /// The first page of range `range` in the client's page space.
    fn range_first_page(&self, range: usize) -> u64 {
        let region = &self.regions[self.ranges[range].region];
        region.first_page + (range - region.first_range) as u64 * region.pages_per_range
    }

    /// Pages of the client's page space (every region).
    pub fn page_count(&self) -> u64 {
        self.versions.len() as u64
    }

    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    pub fn split_bytes_of_range(&self, range: usize) -> usize {
        self.regions[self.ranges[range].region].split_bytes
    }

    pub fn pages_per_range_of(&self, range: usize) -> u64 {
        self.regions[self.ranges[range].region].pages_per_range
    }

    /// The placement policy (the driver places new regions with it).
    pub fn placement_mut(&mut self) -> &mut dyn Placement {
        self.placement.as_mut()
    }

    /// Nodes added without a connection (unreachable at a reopen) count as failed: their slabs
    /// are unavailable and rebuilt, and they are probed.
    pub fn fail_unreachable_nodes(&mut self, now: Instant) {
        self.now = now;
        for node in 0..self.nodes.len() {
            if !self.nodes[node].connected && self.nodes[node].membership != Membership::Removed {
                self.nodes[node].connected = true;
                self.node_failed(node, "unreachable");
            }
        }
    }

    pub fn shape_of_range(&self, range: usize) -> Shape {
        self.regions[self.ranges[range].region].shape
    }

    pub fn nodes(&self) -> &[NodeEntry] {
        &self.nodes
    }

    pub fn node(&self, node: NodeId) -> &NodeEntry {
        &self.nodes[node]
    }

    /// Updates what the engine knows of a node's load (a NodeInfo the driver fetched).
    pub fn set_node_info(&mut self, node: NodeId, info: NodeInfo) {
        self.nodes[node].info = info;
    }

    /// Forgets a page: it reads as zeros, with no remote I/O, until written again.
    pub fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        self.check_page(page, self.config.page_bytes)?;
        assert!(!self.page_in_flight(page), "discard between ops on the page only");
        self.page_flags[page as usize] |= PAGE_DISCARDED;
        Ok(())
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
    fn send_control(&mut self, node: NodeId, message: &Control) -> Option<u64> {
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
        let ops = self.slots.iter().filter(|slot| slot.in_use()).map(|slot| slot.deadline);
        let nodes = self.nodes.iter().filter_map(|node| self.node_deadline(node));
        let rebuilds = self.regenerations.iter().filter_map(|task| task.not_before());
        ops.chain(nodes).chain(rebuilds).min()
    }

    pub fn regeneration_status(&self) -> RegenerationStatus {
        RegenerationStatus { in_flight: self.regenerations.len(), done: self.regenerations_done }
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

    // ---- shared memory ----------------------------------------------------------------------

    /// Hands the engine a shared mapping of split `split` of range `range` (exported by its
    /// node); splits there are then loads and stores.
    pub fn set_shared_mapping(&mut self, range: usize, split: usize, mapping: ShmSlab) {
        if self.shm.len() < self.ranges.len() * MAX_SPLITS {
            self.shm.resize_with(self.ranges.len() * MAX_SPLITS, || None);
        }
        self.shm[range * MAX_SPLITS + split] = Some(mapping);
        self.shm_in_use = true;
    }

    pub fn shm_in_use(&self) -> bool {
        self.shm_in_use
    }

    /// Slabs rebuilt on a node with a Unix socket since the last call, to export.
    pub fn take_pending_exports(&mut self) -> Vec<(usize, usize)> {
        std::mem::take(&mut self.pending_exports)
    }

    /// The shared mapping of split `split` of range `range`, if exported and still the slab the
    /// range names (a rebuilt or replaced slab never reuses an old mapping).
    fn live_shm(&self, range: usize, split: usize) -> Option<&ShmSlab> {
        let mapping = self.shm.get(range * MAX_SPLITS + split)?.as_ref()?;
        let slab = self.ranges[range].slabs[split];
        (mapping.node == slab.node && mapping.slab_id == slab.slab_id).then_some(mapping)
    }

    /// Forgets the shared mapping of one split (revoked, evicted, its node lost, or replaced).
    fn drop_shm(&mut self, range: usize, split: usize) {
        if let Some(mapping) = self.shm.get_mut(range * MAX_SPLITS + split) {
            *mapping = None;
        }
    }

    /// The splits of range `range` read and written through shared memory.
    pub fn shared_memory_splits(&self, range: usize) -> SplitMask {
        if !self.shm_in_use {
            return 0;
        }
        (0..self.ranges[range].slabs.len())
            .filter(|&split| self.live_shm(range, split).is_some())
            .fold(0, |mask, split| mask | (1 << split))
    }

    /// Starts loading the shared-memory slots of `mask` (see [`ShmSlab::prefetch`]).
    fn prefetch_shm(&self, range: usize, slot_in_range: u32, mask: SplitMask) {
        if !self.shm_in_use {
            return;
        }
        for split in (0..self.ranges[range].slabs.len()).filter(|split| mask & (1 << split) != 0) {
            if let Some(mapping) = self.live_shm(range, split) {
                mapping.prefetch(slot_in_range);
            }
        }
    }

    /// The node addresses of the splits in `mask` of range `range` (for error reports).
    fn nodes_of(&self, range: usize, mask: SplitMask) -> Vec<SocketAddr> {
        let slabs = &self.ranges[range].slabs;
        (0..slabs.len())
            .filter(|split| mask & (1 << split) != 0)
            .map(|split| self.nodes[slabs[split].node].address)
            .collect()
    }

    /// Candidates for a new slab: connected members, with their loads.
    fn placement_candidates(&self) -> Vec<NodeLoad> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.connected && node.membership == Membership::Member)
            .map(|(index, node)| node.load(index))
            .collect()
    }
}
