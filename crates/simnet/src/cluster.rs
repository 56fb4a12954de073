//! The simulated cluster: nodes, connections, the event queue of simulated time, and faults.
//!
//! Connections: each (node, client id) pair has at most one current connection, opened by
//! [`SimCluster::connect`]. A connection has two ends. The client end is open until the client
//! closes it (`disconnect`, `connect` again, `crash_client`) or hears `ConnectionLost`; the node
//! end is open until the node closes it (a refusal that closes, kill, partition) or the client's
//! close reaches it. Bytes the client sends travel only on an open client end and are served only
//! on an open node end; replies travel only from an open node end and are delivered only to an
//! open client end. A closed connection's id is never reused, so late messages of an old
//! connection can never be taken for a new one's.
//!
//! Events: one `BTreeMap` keyed by (time, sequence number), so events due at the same time run in
//! the order they were scheduled. Per connection and direction, a message never arrives before
//! the previous one (its arrival time is at least the previous arrival time): TCP order.

use crate::error::SimError;
use crate::regeneration::{self, Job, Scratch, Step};
use crate::schedule::{FaultAction, ScheduledFault};
use crate::{NetworkOptions, SimTime};
use node::{Inbox, SimNode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem_node::core::RebuildOutcome;
use remem_proto::{Control, NodeInfo, SplitMeta, MAX_FAILURE_DOMAIN_BYTES};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

mod faults;
pub(crate) mod node;

/// What reaches a client: bytes from one of its connections, or the news that one closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Whole frames the node wrote on the client's connection to it, in the order written. One
    /// delivery is one of the node's writes: all its answers to one arrival of bytes (or one
    /// unsolicited frame: `SlabEvicted`, `RegenerationDone`).
    Bytes { client_id: u64, node: usize, bytes: Vec<u8> },
    /// The client's connection to `node` closed under it (the node died, was partitioned, or
    /// closed the connection after an `Error`). Bytes sent since are dropped; `connect` again.
    ConnectionLost { client_id: u64, node: usize },
}

/// When a partitioned node's client hears that its connection is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionNotice {
    /// `ConnectionLost` is delivered at the time of the partition (a reset seen at once).
    Immediately,
    /// `ConnectionLost` is delivered this long after the partition (a keepalive's verdict).
    After(SimTime),
    /// Never: the client sees only silence, times out, and calls `disconnect` (what a real
    /// partition usually looks like).
    Never,
}

/// What happens to the messages a crashed client had sent that had not reached their node yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFlightFate {
    /// They arrive and are served (the kernel had them; a process crash does not lose them).
    Delivered,
    /// They are lost (the host died with them, or the connection was reset).
    Dropped,
    /// Each arrives with probability `delivered_ppm / 1_000_000`, independently: a crash in the
    /// middle of a write's fan-out, leaving a page torn across nodes.
    Random { delivered_ppm: u32 },
}

/// How many faults of each kind were injected (calls that returned `Err` count nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub kills: u64,
    pub restarts: u64,
    pub stalls: u64,
    pub partitions: u64,
    /// Calls of `set_extra_delay` with a non-zero delay or jitter.
    pub stragglers: u64,
    /// Calls of `flip_bits`, and the bits they flipped in all.
    pub bit_flip_faults: u64,
    pub bits_flipped: u64,
    pub evictions: u64,
    /// `WriteSplit`s armed to be dropped by `drop_next_writes`, and those actually dropped.
    pub writes_armed_to_drop: u64,
    pub writes_dropped: u64,
    pub client_crashes: u64,
    /// Messages of crashed clients lost in flight.
    pub in_flight_messages_dropped: u64,
}

/// A node's liveness and the standing faults on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeState {
    pub alive: bool,
    /// How many times the node was killed.
    pub incarnation: u64,
    /// The node answers nothing before this time (0: never stalled).
    pub stalled_until: SimTime,
    /// The node is unreachable before this time (0: never partitioned).
    pub partitioned_until: SimTime,
    pub extra_delay_ns: SimTime,
    pub extra_jitter_ns: SimTime,
    /// `WriteSplit`s the node will still drop.
    pub writes_to_drop: u32,
    pub slabs_mapped: u32,
}

/// One mapped slab as a checker sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabInfo {
    pub slab_id: u32,
    pub owner_client_id: u64,
    pub split_bytes: u32,
    pub split_index: u8,
    pub first_page: u64,
    pub range_id: u64,
    pub slots: u32,
    /// A rebuild is filling it now.
    pub regenerating: bool,
}

/// How a rebuild ended (what its `RegenerationDone` said, and when).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegenerationReport {
    pub node: usize,
    pub slab_id: u32,
    pub client_id: u64,
    /// The `Regenerate`'s request id, echoed by `RegenerationDone`.
    pub request_id: u64,
    pub pages: u32,
    pub pages_rebuilt: u64,
    pub pages_skipped: u64,
    pub pages_lost: u64,
    pub started_at: SimTime,
    pub finished_at: SimTime,
    /// Whether the requesting connection was open on the node's side to carry the report (the
    /// client may still miss it if its end closes before the report arrives).
    pub report_sent: bool,
}

struct Connection {
    node: usize,
    client_id: u64,
    node_open: bool,
    client_open: bool,
    /// Set by a partition: replies already in flight are lost.
    cut: bool,
    /// The connection volunteered to answer activity queries (`AnswerActivity`); kept for
    /// fidelity, the simulated node never queries.
    answers_activity: bool,
    /// A partial frame received, waiting for the rest.
    input: Vec<u8>,
    /// Arrival time of the last message scheduled in each direction (TCP order).
    to_node_last: SimTime,
    to_client_last: SimTime,
}

enum Event {
    /// Client bytes reaching the node.
    ToNode {
        connection: u64,
        bytes: Vec<u8>,
    },
    /// The client's close (FIN) reaching the node, after everything it sent before.
    ClientClosed {
        connection: u64,
    },
    /// Node bytes reaching the client.
    ToClient {
        connection: u64,
        bytes: Vec<u8>,
    },
    /// `ConnectionLost` reaching the client.
    Lost {
        connection: u64,
    },
    /// A stall may have ended: serve what queued up.
    Wake {
        node: usize,
    },
    RegenerationStep {
        job: u64,
    },
}

/// A seeded, simulated remem cluster: memory nodes, the client connections to them, and time.
///
/// # How a simulated node answers
///
/// By the real node core (`remem_node::core`), frame for frame (docs/PROTOCOL.md):
/// - `MapSlab`: split size checked (`BadSplitSize`), capacity counted in slab footprints (slab,
///   metadata and header; `add_node`'s `capacity_slabs` slabs of the smallest split size fit)
///   (`NoCapacity` when full); `SlabMapped { slab_id, slots = slab_size / split_bytes }`. Slab ids
///   run 1, 2, ... per life of the node and are never reused within one.
/// - `UnmapSlab`: `Ok`. `WriteSplit`: payload, version and checksum stored as given;
///   `WriteSplitOk`. `ReadSplit`/`ReadSplits`: stored metadata and payload (a slot never written
///   reads version 0, checksum 0, zero bytes).
/// - `NodeInfo`: `NodeInfoReply` (capacity and free bytes, slabs mapped, failure
///   domain, slab size, rebuild progress). `Ping`: `Pong`. `AnswerActivity`: `Ok`. `Pong` and
///   `SlabActivity`: no reply. `ExportSlab`, `InjectFault`: `Error(Unsupported)`.
/// - `Regenerate`: the real node's checks, `Ok`, then after `pages ×
///   NetworkOptions::regeneration_ns_per_page` of simulated time a `RegenerationDone` with the
///   same request id (see the `regeneration` module for how pages are rebuilt).
/// - A slab is read, written, unmapped or rebuilt only by the client id that mapped it
///   (`NotOwner`). Bad frames, kinds a node does not accept and refused `WriteSplit`s get an
///   `Error` and the connection is closed (the client then gets `ConnectionLost`); other refusals
///   leave it open.
pub struct SimCluster {
    options: NetworkOptions,
    /// Draws every message's delay.
    network_rng: StdRng,
    /// Draws what faults choose (bits to flip, slabs to evict, in-flight fates), separately, so
    /// a fault does not shift the delays of everything after it.
    fault_rng: StdRng,
    /// Everything due up to this time has happened.
    clock: SimTime,
    nodes: Vec<SimNode>,
    connections: BTreeMap<u64, Connection>,
    /// The current connection of each (node, client id): its client end is open.
    current: BTreeMap<(usize, u64), u64>,
    next_connection: u64,
    events: BTreeMap<(SimTime, u64), Event>,
    next_sequence: u64,
    /// Deliveries due by `clock`, not yet polled, with their arrival time.
    ready: VecDeque<(SimTime, Delivery)>,
    jobs: BTreeMap<u64, Job>,
    next_job: u64,
    scratch: Scratch,
    counts: FaultCounts,
    reports: Vec<RegenerationReport>,
}

/// Salt between the two generators' seeds.
const FAULT_RNG_SALT: u64 = 0x5EED_FA17_0000_0001;

impl SimCluster {
    /// An empty cluster at time 0 whose every random choice derives from `seed`.
    pub fn new(seed: u64, options: NetworkOptions) -> SimCluster {
        SimCluster {
            options,
            network_rng: StdRng::seed_from_u64(seed),
            fault_rng: StdRng::seed_from_u64(seed ^ FAULT_RNG_SALT),
            clock: 0,
            nodes: Vec::new(),
            connections: BTreeMap::new(),
            current: BTreeMap::new(),
            next_connection: 1,
            events: BTreeMap::new(),
            next_sequence: 0,
            ready: VecDeque::new(),
            jobs: BTreeMap::new(),
            next_job: 1,
            scratch: Scratch::default(),
            counts: FaultCounts::default(),
            reports: Vec::new(),
        }
    }

    pub fn options(&self) -> NetworkOptions {
        self.options
    }

    /// Everything due up to this time has happened.
    pub fn now(&self) -> SimTime {
        self.clock
    }

    /// Adds a live node lending `capacity_slabs` slabs of `slab_size_bytes`, and returns its
    /// index: stable, never reused. Its node id is `index + 1`, its address
    /// [`SimCluster::node_address`].
    ///
    /// Panics (a programmer error) if the failure domain is longer than 64 bytes or the slab size
    /// is not a power of two in 4 KiB..=4 GiB.
    pub fn add_node(&mut self, failure_domain: String, capacity_slabs: u32, slab_size_bytes: u64) -> usize {
        assert!(failure_domain.len() <= MAX_FAILURE_DOMAIN_BYTES, "failure domain longer than 64 bytes");
        assert!(
            slab_size_bytes.is_power_of_two() && (4096..=1 << 32).contains(&slab_size_bytes),
            "slab size {slab_size_bytes} is not a power of two in 4 KiB..=4 GiB"
        );
        let index = self.nodes.len();
        let address = regeneration::node_address(index);
        self.nodes.push(SimNode::new(
            index as u64 + 1,
            address,
            failure_domain,
            capacity_slabs,
            slab_size_bytes,
        ));
        index
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The address node `node` is known by, to name it as a `Regenerate` source: 10.a.b.c:7077
    /// with a.b.c the index. Any other address in a `Regenerate` names no node (that source
    /// fails, as an unreachable one would).
    pub fn node_address(&self, node: usize) -> SocketAddr {
        self.nodes[node].address
    }

    /// Opens `client_id`'s connection to `node` (closing the one it had, as `disconnect` does)
    /// and returns the node's info, as the handshake and a `NodeInfo` would. There is no HMAC in
    /// the simulator.
    ///
    /// Errors: `NoSuchNode`; `NodeDead` until `restart_empty`; `NodePartitioned` until the
    /// partition heals; `NodeStalled` while stalled (a real handshake would hang and time out).
    pub fn connect(&mut self, now: SimTime, node: usize, client_id: u64) -> Result<NodeInfo, SimError> {
        self.advance(now);
        self.check_node(node)?;
        let state = &self.nodes[node];
        if !state.alive {
            return Err(SimError::NodeDead { node });
        }
        if state.is_partitioned(now) {
            return Err(SimError::NodePartitioned { node, until: state.partitioned_until });
        }
        if state.is_stalled(now) {
            return Err(SimError::NodeStalled { node, until: state.stalled_until });
        }
        self.disconnect(now, node, client_id);
        let id = self.next_connection;
        self.next_connection += 1;
        self.connections.insert(
            id,
            Connection {
                node,
                client_id,
                node_open: true,
                client_open: true,
                cut: false,
                answers_activity: false,
                input: Vec::new(),
                to_node_last: now,
                to_client_last: now,
            },
        );
        self.current.insert((node, client_id), id);
        Ok(self.nodes[node].core.node_info())
    }

    /// Whether `client_id` has a connection to `node` it has not closed nor heard was lost (its
    /// node end may be closed already, with `ConnectionLost` on the way).
    pub fn is_connected(&self, node: usize, client_id: u64) -> bool {
        self.current.contains_key(&(node, client_id))
    }

    /// The client closes its connection to `node` (after a timeout, say). What it sent before
    /// still arrives and is served; nothing more is delivered on it. No-op without a connection.
    pub fn disconnect(&mut self, now: SimTime, node: usize, client_id: u64) {
        self.advance(now);
        if let Some(id) = self.current.remove(&(node, client_id)) {
            self.close_client_end(now, id);
        }
    }

    /// Bytes `client_id` wrote to its connection to `node`: whole frames, or any bytes at all (a
    /// partial frame waits at the node for the rest). Dropped if the client has no open
    /// connection to `node`; the client learns of a connection that went down by
    /// `ConnectionLost`.
    pub fn send(&mut self, now: SimTime, node: usize, client_id: u64, bytes: &[u8]) {
        self.advance(now);
        let Some(&id) = self.current.get(&(node, client_id)) else {
            return;
        };
        if bytes.is_empty() {
            return;
        }
        let delay = self.one_way_delay();
        let connection = self.connections.get_mut(&id).expect("current connections exist");
        let at = (now + delay).max(connection.to_node_last);
        connection.to_node_last = at;
        self.schedule(at, Event::ToNode { connection: id, bytes: bytes.to_vec() });
    }

    /// When the next thing happens: a delivery already due, or the next internal event (which
    /// may deliver nothing). `None` when the simulation is quiet until the next call.
    pub fn next_event_time(&self) -> Option<SimTime> {
        let ready = self.ready.front().map(|(at, _)| *at);
        let event = self.events.first_key_value().map(|((at, _), _)| *at);
        match (ready, event) {
            (Some(ready), Some(event)) => Some(ready.min(event)),
            (ready, event) => ready.or(event),
        }
    }

    /// Runs everything due by `now` and appends what reached clients, in arrival order.
    ///
    /// Panics if `now` is before an earlier call's time: simulated time never goes back.
    pub fn poll(&mut self, now: SimTime, out: &mut Vec<Delivery>) {
        self.advance(now);
        out.extend(self.ready.drain(..).map(|(_, delivery)| delivery));
    }

    // ----- Inspection, for checkers -----

    /// The metadata stored in `slot` of slab `slab_id` on `node`, whoever owns it; `None` if the
    /// node is dead, the slab is not mapped or the slot is out of range.
    pub fn slab_meta(&self, node: usize, slab_id: u32, slot: u32) -> Option<SplitMeta> {
        self.slab_split(node, slab_id, slot).map(|(meta, _)| meta)
    }

    /// The metadata and bytes stored in `slot` of slab `slab_id` on `node`.
    pub fn slab_split(&self, node: usize, slab_id: u32, slot: u32) -> Option<(SplitMeta, Vec<u8>)> {
        let slab = self.nodes.get(node)?.core.table.get_any(slab_id).ok()?;
        (slot < slab.slots()).then(|| {
            let mut payload = vec![0; slab.split_bytes() as usize];
            (slab.read(slot, &mut payload), payload)
        })
    }

    /// The slabs mapped on `node`, as (slab id, owner client id), by slab id.
    pub fn slabs_of(&self, node: usize) -> Vec<(u32, u64)> {
        self.nodes[node].core.table.owners()
    }

    pub fn slab_info(&self, node: usize, slab_id: u32) -> Option<SlabInfo> {
        let slab = self.nodes.get(node)?.core.table.get_any(slab_id).ok()?;
        let label = slab.label();
        Some(SlabInfo {
            slab_id,
            owner_client_id: slab.owner_client_id(),
            split_bytes: label.split_bytes,
            split_index: label.split_index,
            first_page: label.first_page,
            range_id: label.range_id,
            slots: slab.slots(),
            regenerating: slab.is_regenerating(),
        })
    }

    /// What the node would answer to `NodeInfo` now (`None` if dead).
    pub fn node_info(&self, node: usize) -> Option<NodeInfo> {
        let state = &self.nodes[node];
        state.alive.then(|| state.core.node_info())
    }

    pub fn node_state(&self, node: usize) -> NodeState {
        let state = &self.nodes[node];
        NodeState {
            alive: state.alive,
            incarnation: state.incarnation,
            stalled_until: state.stalled_until,
            partitioned_until: state.partitioned_until,
            extra_delay_ns: state.extra_delay_ns,
            extra_jitter_ns: state.extra_jitter_ns,
            writes_to_drop: state.writes_to_drop,
            slabs_mapped: state.core.table.stats().slabs_mapped,
        }
    }

    pub fn is_alive(&self, node: usize) -> bool {
        self.nodes[node].alive
    }

    pub fn is_partitioned(&self, node: usize, now: SimTime) -> bool {
        self.nodes[node].is_partitioned(now)
    }

    pub fn is_stalled(&self, node: usize, now: SimTime) -> bool {
        self.nodes[node].is_stalled(now)
    }

    pub fn fault_counts(&self) -> FaultCounts {
        FaultCounts { writes_dropped: self.nodes.iter().map(|node| node.writes_dropped).sum(), ..self.counts }
    }

    /// Every rebuild that ended, in the order they ended (rebuilds on a node that was killed
    /// never end).
    pub fn regeneration_reports(&self) -> &[RegenerationReport] {
        &self.reports
    }

    // ----- The machinery -----

    /// Runs every event due by `now`, in time order, then sets the clock to `now`.
    fn advance(&mut self, now: SimTime) {
        assert!(now >= self.clock, "simulated time went back from {} to {now}", self.clock);
        while let Some(entry) = self.events.first_entry() {
            let (at, _) = *entry.key();
            if at > now {
                break;
            }
            let event = entry.remove();
            self.clock = at;
            self.handle(at, event);
        }
        self.clock = now;
    }

    fn schedule(&mut self, at: SimTime, event: Event) {
        debug_assert!(at >= self.clock, "events are never scheduled in the past");
        self.events.insert((at, self.next_sequence), event);
        self.next_sequence += 1;
    }

    fn one_way_delay(&mut self) -> SimTime {
        let NetworkOptions { latency_ns, jitter_ns, .. } = self.options;
        self.network_rng
            .gen_range(latency_ns.saturating_sub(jitter_ns)..=latency_ns.saturating_add(jitter_ns))
    }

    fn handle(&mut self, now: SimTime, event: Event) {
        match event {
            Event::ToNode { connection, bytes } => {
                self.arrive_at_node(now, Inbox::Bytes { connection, bytes })
            }
            Event::ClientClosed { connection } => self.arrive_at_node(now, Inbox::Closed { connection }),
            Event::ToClient { connection: id, bytes } => {
                if let Some(connection) = self.connections.get(&id) {
                    if connection.client_open && !connection.cut {
                        let delivery =
                            Delivery::Bytes { client_id: connection.client_id, node: connection.node, bytes };
                        self.ready.push_back((now, delivery));
                    }
                }
            }
            Event::Lost { connection: id } => {
                if let Some(connection) = self.connections.get_mut(&id) {
                    if connection.client_open {
                        connection.client_open = false;
                        let (node, client_id) = (connection.node, connection.client_id);
                        self.current.remove(&(node, client_id));
                        self.ready.push_back((now, Delivery::ConnectionLost { client_id, node }));
                    }
                    self.reap(id);
                }
            }
            Event::Wake { node } => self.wake(now, node),
            Event::RegenerationStep { job } => self.regeneration_step(now, job),
        }
    }

    /// Something the client sent reaches its node: served now, or queued behind a stall.
    fn arrive_at_node(&mut self, now: SimTime, item: Inbox) {
        let id = match &item {
            Inbox::Bytes { connection, .. } | Inbox::Closed { connection } => *connection,
        };
        let Some(connection) = self.connections.get(&id) else {
            return;
        };
        if !connection.node_open {
            return;
        }
        let node = &mut self.nodes[connection.node];
        debug_assert!(node.alive && !node.is_partitioned(now), "kill and partition close node ends");
        if node.is_stalled(now) || !node.inbox.is_empty() {
            node.inbox.push_back(item);
            return;
        }
        self.take_in(now, item);
    }

    /// A stall that may have ended: serve the queue in order if it has.
    fn wake(&mut self, now: SimTime, node: usize) {
        if self.nodes[node].is_stalled(now) {
            return;
        }
        while let Some(item) = self.nodes[node].inbox.pop_front() {
            self.take_in(now, item);
        }
    }

    fn take_in(&mut self, now: SimTime, item: Inbox) {
        match item {
            Inbox::Bytes { connection, bytes } => self.serve(now, connection, bytes),
            Inbox::Closed { connection: id } => {
                if let Some(connection) = self.connections.get_mut(&id) {
                    connection.node_open = false;
                    self.reap(id);
                }
            }
        }
    }

    /// The node reads `bytes` from connection `id` and answers everything complete in them.
    fn serve(&mut self, now: SimTime, id: u64, bytes: Vec<u8>) {
        let Some(connection) = self.connections.get_mut(&id) else {
            return;
        };
        if !connection.node_open {
            return;
        }
        let node_index = connection.node;
        let mut buffered = std::mem::take(&mut connection.input);
        let input: &[u8] = if buffered.is_empty() {
            &bytes
        } else {
            buffered.extend_from_slice(&bytes);
            &buffered
        };
        let mut out = Vec::new();
        let served = self.nodes[node_index].serve(
            connection.client_id,
            id,
            input,
            &mut out,
            &mut connection.answers_activity,
        );
        if !served.close && served.consumed < input.len() {
            connection.input = input[served.consumed..].to_vec();
        }
        if !out.is_empty() {
            self.send_to_client(now, id, out);
        }
        if served.close {
            self.close_node_end(now, id, LostNotice::AfterReplies);
        }
        let accepted = std::mem::take(&mut self.nodes[node_index].accepted);
        for regeneration in accepted {
            let incarnation = self.nodes[node_index].incarnation;
            let job = Job::new(node_index, incarnation, regeneration, self.nodes.len(), &self.options, now);
            let at = now + job.next_step_duration(&self.options);
            let job_id = self.next_job;
            self.next_job += 1;
            self.jobs.insert(job_id, job);
            self.schedule(at, Event::RegenerationStep { job: job_id });
        }
    }

    fn regeneration_step(&mut self, now: SimTime, job_id: u64) {
        let Some(mut job) = self.jobs.remove(&job_id) else {
            return;
        };
        let node = &self.nodes[job.node];
        assert!(node.alive && node.incarnation == job.incarnation, "a kill drops its node's jobs");
        if node.is_stalled(now) {
            let resume = node.stalled_until;
            self.jobs.insert(job_id, job);
            self.schedule(resume, Event::RegenerationStep { job: job_id });
            return;
        }
        match regeneration::step(&self.nodes, &mut self.scratch, &mut job, &self.options, now) {
            Step::Continue { at } => {
                self.jobs.insert(job_id, job);
                self.schedule(at, Event::RegenerationStep { job: job_id });
            }
            Step::Finished(outcome) => self.finish_regeneration(now, job, outcome),
        }
    }

    fn finish_regeneration(&mut self, now: SimTime, job: Job, outcome: RebuildOutcome) {
        let admission = job.steps.admission();
        self.nodes[job.node].core.rebuilds.release(admission, job.pages_counted);
        let report_sent =
            self.connections.get(&job.connection).is_some_and(|connection| connection.node_open);
        if report_sent {
            let mut frame = Vec::new();
            Control::RegenerationDone {
                slab_id: admission.slab_id,
                pages_rebuilt: outcome.pages_rebuilt,
                pages_skipped: outcome.pages_skipped,
                pages_lost: outcome.pages_lost,
            }
            .encode(job.request_id, &mut frame);
            self.send_to_client(now, job.connection, frame);
        }
        let admission = job.steps.admission();
        self.reports.push(RegenerationReport {
            node: job.node,
            slab_id: admission.slab_id,
            client_id: admission.client_id,
            request_id: job.request_id,
            pages: admission.pages,
            pages_rebuilt: outcome.pages_rebuilt,
            pages_skipped: outcome.pages_skipped,
            pages_lost: outcome.pages_lost,
            started_at: job.started_at,
            finished_at: now,
            report_sent,
        });
    }

    /// The node writes `bytes` on connection `id` (whose node end must be open).
    fn send_to_client(&mut self, now: SimTime, id: u64, bytes: Vec<u8>) {
        let delay = self.one_way_delay();
        let connection = self.connections.get_mut(&id).expect("the node writes on its open connections");
        debug_assert!(connection.node_open);
        let node = &self.nodes[connection.node];
        let extra = node.extra_delay_ns
            + if node.extra_jitter_ns > 0 { self.network_rng.gen_range(0..=node.extra_jitter_ns) } else { 0 };
        let at = (now + delay + extra).max(connection.to_client_last);
        connection.to_client_last = at;
        self.schedule(at, Event::ToClient { connection: id, bytes });
    }

    /// The node's end of connection `id` closes; its client hears as `notice` says.
    fn close_node_end(&mut self, now: SimTime, id: u64, notice: LostNotice) {
        let lost_after = match notice {
            LostNotice::AfterReplies => Some(self.one_way_delay()),
            LostNotice::Partition(PartitionNotice::Immediately) => Some(0),
            LostNotice::Partition(PartitionNotice::After(delay)) => Some(delay),
            LostNotice::Partition(PartitionNotice::Never) => None,
        };
        let connection = self.connections.get_mut(&id).expect("closing a known connection");
        connection.node_open = false;
        connection.input = Vec::new();
        if let (true, Some(after)) = (connection.client_open, lost_after) {
            let at = (now + after).max(connection.to_client_last);
            connection.to_client_last = at;
            self.schedule(at, Event::Lost { connection: id });
        }
        self.reap(id);
    }

    /// The client's end of connection `id` closes (the client already forgot it as current); the
    /// node sees the close after everything sent before it.
    fn close_client_end(&mut self, now: SimTime, id: u64) {
        let connection = self.connections.get_mut(&id).expect("closing a known connection");
        connection.client_open = false;
        if connection.node_open {
            let at = (now + self.options.latency_ns).max(connection.to_node_last);
            connection.to_node_last = at;
            self.schedule(at, Event::ClientClosed { connection: id });
        }
        self.reap(id);
    }

    /// Forgets a connection closed at both ends; late events for it find nothing and are dropped.
    fn reap(&mut self, id: u64) {
        if self
            .connections
            .get(&id)
            .is_some_and(|connection| !connection.node_open && !connection.client_open)
        {
            self.connections.remove(&id);
        }
    }

    /// Connections of `node` whose node end is open, by id.
    fn connections_of(&self, node: usize) -> Vec<u64> {
        self.connections
            .iter()
            .filter(|(_, connection)| connection.node == node && connection.node_open)
            .map(|(id, _)| *id)
            .collect()
    }

    fn random_slab(&mut self, now: SimTime, node: usize) -> Result<u32, SimError> {
        self.advance(now);
        self.check_alive(node)?;
        let slabs = self.nodes[node].core.table.owners();
        if slabs.is_empty() {
            return Err(SimError::NoSlab { node });
        }
        let pick = self.fault_rng.gen_range(0..slabs.len());
        Ok(slabs[pick].0)
    }

    fn check_node(&self, node: usize) -> Result<(), SimError> {
        if node >= self.nodes.len() {
            return Err(SimError::NoSuchNode { node, node_count: self.nodes.len() });
        }
        Ok(())
    }

    fn check_alive(&self, node: usize) -> Result<(), SimError> {
        self.check_node(node)?;
        if !self.nodes[node].alive {
            return Err(SimError::NodeDead { node });
        }
        Ok(())
    }
}

/// How the client of a connection closed by its node hears of it.
#[derive(Clone, Copy)]
enum LostNotice {
    /// One network delay after the node's last reply (a FIN or reset after the data).
    AfterReplies,
    Partition(PartitionNotice),
}
