//! The simulated driver: the client's sans-I/O engine (`remem_client::engine`) run against a
//! [`SimCluster`] in simulated time, the way the blocking driver runs it over sockets.
//!
//! Job: carry bytes and events between the two and nothing else. Every engine call is followed
//! by the same chores as in `crates/client/src/driver`: carry out the engine's actions (connect,
//! disconnect), send its outboxes in its send order, collect completions, submit queued ops.
//! Bytes from a node are cut into whole frames (a partial frame waits in a per-node buffer) and
//! handed to `Engine::on_frame`; a frame that breaks the protocol drops the connection, as the
//! transport does, and is counted in [`DriverStats::protocol_violations`] (a simulated node never
//! sends one, so a checker treats any as a bug). The engine is ticked whenever its
//! `next_deadline` comes.
//!
//! Time: one fixed `base = Instant::now()` taken at construction; the engine sees
//! `base + sim_time`, so only differences matter and a run depends on nothing but its inputs.
//! Simulated time advances only to the next thing that happens: a cluster event, an engine
//! deadline, a scheduled fault, or the time a caller runs to.
//!
//! Invariants:
//! - engine node id == simulated node index: nodes are added to the engine in cluster order,
//!   also after a client crash (the reopened engine gets every node again, in order);
//! - no hash-order iteration and no wall clock: the same cluster seed, placement seed and calls
//!   give the same run, completion for completion;
//! - simulated time never stands still forever: more than [`MAX_STEPS_AT_ONE_TIME`] steps at one
//!   time is an engine (or driver) livelock and panics with the time.
//!
//! A client crash ([`SimDriver::crash_client`]) drops the engine; [`SimDriver::reopen`] builds a
//! new one with the same client id from the saved slab map (what a client saves after connecting
//! and after each rebuild: the slabs of each range that were complete then), every page's
//! version unknown, as `Client::reopen` does.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use remem_client::core::Shape;
use remem_client::engine::{
    Action, Engine, EngineConfig, NodeId, OpBuffers, OpDone, RegionInfo, SlabRef, Submit,
};
use remem_client::PageError;
use remem_codec::CodecParams;
use remem_placement::{CodingSets, GroupChoice, LeastLoaded, NodeLoad, Placement};
use remem_proto::{Control, FrameHeader, HEADER_BYTES};

use crate::schedule::{FaultAction, ScheduledFault};

mod checks;
mod lazy;
mod operations;
mod ops;
mod tally;

use crate::{Delivery, InFlightFate, SimCluster, SimTime};
pub use ops::{AbandonedOp, Completion, SimOp, SimOpKind};
use ops::{OpEntry, OpTable};
pub use tally::FaultTally;

/// More steps than this at one simulated time means nothing makes progress.
pub const MAX_STEPS_AT_ONE_TIME: u32 = 100_000;
/// Lines of trace kept (the most recent ones).
const TRACE_LINES: usize = 4_000;

/// The placement policy of the simulated client, built from a seed (at start and at reopen).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementPolicy {
    LeastLoaded,
    /// CodingSets with extended groups of width + `load_balancing_factor` nodes. One width per
    /// client: regions of different widths cannot share it.
    CodingSets {
        load_balancing_factor: usize,
        group_choice: GroupChoice,
    },
}

impl PlacementPolicy {
    pub fn build(self, seed: u64) -> Box<dyn Placement> {
        let rng = StdRng::seed_from_u64(seed);
        match self {
            PlacementPolicy::LeastLoaded => Box::new(LeastLoaded::new(rng)),
            PlacementPolicy::CodingSets { load_balancing_factor, group_choice } => {
                Box::new(CodingSets::new(rng, load_balancing_factor, group_choice))
            }
        }
    }
}

/// Counters of the driver itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    pub frames_received: u64,
    pub bytes_sent: u64,
    /// Frames from a node that broke the protocol. A simulated node never sends one.
    pub protocol_violations: u64,
    pub connects: u64,
    pub connects_refused: u64,
    pub disconnects: u64,
    pub connections_lost: u64,
    pub ticks: u64,
    pub ops_submitted: u64,
    pub ops_completed: u64,
    pub client_crashes: u64,
}

/// A region as the saved slab map records it.
#[derive(Clone, Debug)]
struct SavedRegion {
    shape: Shape,
    page_count: u64,
    pages_per_range: u64,
    first_range: usize,
    range_count: usize,
}

/// The client engine driven over a simulated cluster in simulated time.
pub struct SimDriver {
    cluster: SimCluster,
    engine: Engine,
    config: EngineConfig,
    placement: PlacementPolicy,
    placement_seed: u64,
    base: Instant,
    now: SimTime,
    steps_at_now: u32,
    /// Per node: bytes of a frame not complete yet.
    inputs: Vec<Vec<u8>>,
    ops: Vec<Option<OpEntry>>,
    free_tags: Vec<usize>,
    /// Tags waiting for a free slot, in submission order.
    queue: VecDeque<usize>,
    next_op_id: u64,
    completed: Vec<Completion>,
    faults: VecDeque<ScheduledFault>,
    deliveries: Vec<Delivery>,
    saved_regions: Vec<SavedRegion>,
    saved_ranges: Vec<Vec<SlabRef>>,
    saved_at_rebuilds_done: u64,
    /// The lost pages the saved map lists (`Engine::lost_page_runs`).
    saved_lost_pages: Vec<(u64, u64)>,
    removed: Vec<bool>,
    stats: DriverStats,
    tally: FaultTally,
    /// Every node the engine dropped (declared failed or removed), with the time, in order.
    dropped: Vec<(SimTime, NodeId)>,
    /// The first protocol violation: (time, node, why).
    first_violation: Option<(SimTime, NodeId, String)>,
    trace: Option<VecDeque<String>>,
    echo: bool,
}

impl SimDriver {
    /// Connects a client with `config` to every node of `cluster` (engine node `i` is cluster node
    /// `i`) at the cluster's current time. Nodes that refuse the connection join unreachable and
    /// are probed, as `Client::reopen` does.
    pub fn new(
        cluster: SimCluster,
        config: EngineConfig,
        placement: PlacementPolicy,
        placement_seed: u64,
    ) -> SimDriver {
        let base = Instant::now();
        let now = cluster.now();
        let engine = Engine::new(config.clone(), placement.build(placement_seed), base);
        let node_count = cluster.node_count();
        let mut driver = SimDriver {
            cluster,
            engine,
            config,
            placement,
            placement_seed,
            base,
            now,
            steps_at_now: 0,
            inputs: vec![Vec::new(); node_count],
            ops: Vec::new(),
            free_tags: Vec::new(),
            queue: VecDeque::new(),
            next_op_id: 1,
            completed: Vec::new(),
            faults: VecDeque::new(),
            deliveries: Vec::new(),
            saved_regions: Vec::new(),
            saved_ranges: Vec::new(),
            saved_at_rebuilds_done: 0,
            saved_lost_pages: Vec::new(),
            removed: vec![false; node_count],
            stats: DriverStats::default(),
            tally: FaultTally::default(),
            dropped: Vec::new(),
            first_violation: None,
            trace: None,
            echo: false,
        };
        driver.join_all_nodes();
        driver.settle();
        driver
    }

    /// Adds every cluster node to a fresh engine, in order.
    fn join_all_nodes(&mut self) {
        let instant = self.instant();
        for node in 0..self.cluster.node_count() {
            let address = self.cluster.node_address(node);
            let id = match self.cluster.connect(self.now, node, self.config.client_id) {
                Ok(info) => {
                    self.stats.connects += 1;
                    self.engine.add_node(instant, address, None, info, true)
                }
                Err(error) => {
                    self.stats.connects_refused += 1;
                    self.note(|| format!("node {node} unreachable at connect: {error}"));
                    self.engine.add_node(
                        instant,
                        address,
                        None,
                        remem_client::engine::unreachable_node_info(),
                        false,
                    )
                }
            };
            assert_eq!(id, node, "engine node ids follow cluster node indices");
        }
    }

    /// Keeps the last `4000` lines of what happened (faults, connections, errors, rebuilds), for
    /// a failing seed's report. Off by default: formatting costs.
    pub fn enable_trace(&mut self) {
        self.trace = Some(VecDeque::new());
    }

    /// Also prints every trace line as it happens (to interleave with the engine's logs).
    pub fn echo_trace(&mut self) {
        self.enable_trace();
        self.echo = true;
    }

    /// The trace kept by [`SimDriver::enable_trace`], oldest first.
    pub fn trace(&self) -> Vec<String> {
        self.trace.iter().flatten().cloned().collect()
    }

    /// Adds a line to the trace, if on (`line` is not called otherwise).
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            if trace.len() == TRACE_LINES {
                trace.pop_front();
            }
            let at = self.now;
            let line = format!("{:>10.3} ms  {}", at as f64 / 1e6, line());
            if self.echo {
                println!("{line}");
            }
            trace.push_back(line);
        }
    }

    // ---- accessors ------------------------------------------------------------------------

    pub fn now(&self) -> SimTime {
        self.now
    }

    /// The engine's time for simulated time `at`.
    pub fn instant_at(&self, at: SimTime) -> Instant {
        self.base + Duration::from_nanos(at)
    }

    fn instant(&self) -> Instant {
        self.instant_at(self.now)
    }

    /// Simulated time of an engine instant (never before the start).
    pub fn sim_time_of(&self, instant: Instant) -> SimTime {
        instant.saturating_duration_since(self.base).as_nanos() as SimTime
    }

    pub fn cluster(&self) -> &SimCluster {
        &self.cluster
    }

    /// The cluster, for faults and inspection: call it with [`SimDriver::now`] as the time.
    pub fn cluster_mut(&mut self) -> &mut SimCluster {
        &mut self.cluster
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn client_id(&self) -> u64 {
        self.config.client_id
    }

    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Every node the engine dropped (its `Disconnect` actions: declared failed, or removed), with
    /// the time, in order.
    pub fn dropped_nodes(&self) -> &[(SimTime, NodeId)] {
        &self.dropped
    }

    /// The first frame a node sent that the engine rejected: (time, node, the engine's reason).
    /// A simulated node speaks the protocol, so any is a bug of the engine or the simulator.
    pub fn first_protocol_violation(&self) -> Option<&(SimTime, NodeId, String)> {
        self.first_violation.as_ref()
    }

    pub fn fault_tally(&self) -> FaultTally {
        self.tally
    }

    // ---- the loop ---------------------------------------------------------------------------

    /// After every engine call: actions, sends, completions, queued submissions, until quiet.
    fn settle(&mut self) {
        loop {
            while self.engine.has_actions() {
                let actions: Vec<Action> = self.engine.take_actions().collect();
                for action in actions {
                    self.carry_out(action);
                }
            }
            self.flush();
            self.collect_completions();
            let submitted = self.submit_queued();
            self.flush();
            if !submitted && !self.engine.has_actions() {
                break;
            }
        }
        self.maybe_save_map();
    }

    fn carry_out(&mut self, action: Action) {
        match action {
            Action::Disconnect { node } => {
                self.stats.disconnects += 1;
                self.dropped.push((self.now, node));
                self.note(|| format!("engine drops node {node}"));
                self.cluster.disconnect(self.now, node, self.config.client_id);
                self.inputs[node].clear();
            }
            Action::Connect { node } => {
                self.inputs[node].clear();
                match self.cluster.connect(self.now, node, self.config.client_id) {
                    Ok(info) => {
                        self.stats.connects += 1;
                        self.note(|| format!("probe of node {node} connects"));
                        let instant = self.instant();
                        self.engine.node_connected(instant, node, info);
                    }
                    Err(error) => {
                        self.stats.connects_refused += 1;
                        self.note(|| format!("probe of node {node} refused: {error}"));
                    }
                }
            }
        }
    }

    /// Sends every outbox, in the engine's order.
    fn flush(&mut self) {
        let order = self.engine.take_send_order();
        for &node in &order {
            let bytes = self.engine.outgoing(node);
            if bytes.is_empty() {
                continue;
            }
            let sent = bytes.len();
            if self.trace.is_some() {
                let controls = checks::slab_controls(bytes);
                if !controls.is_empty() {
                    self.note(|| format!("to node {node}: {}", controls.join(", ")));
                }
            }
            let bytes = self.engine.outgoing(node);
            self.cluster.send(self.now, node, self.config.client_id, bytes);
            self.engine.mark_sent(node, sent);
            self.stats.bytes_sent += sent as u64;
        }
        self.engine.return_send_order(order);
    }

    /// When the next thing happens: a cluster event, an engine deadline or a scheduled fault.
    pub fn next_event_time(&self) -> Option<SimTime> {
        let cluster = self.cluster.next_event_time();
        let engine = self.engine.next_deadline().map(|deadline| self.sim_time_of(deadline).max(self.now));
        let fault = self.faults.front().map(|fault| fault.at.max(self.now));
        [cluster, engine, fault].into_iter().flatten().min()
    }

    /// Runs the next thing that happens if it happens by `limit` and returns true; otherwise
    /// moves the time to `limit` and returns false.
    pub fn step(&mut self, limit: SimTime) -> bool {
        match self.next_event_time().filter(|at| *at <= limit) {
            Some(at) => {
                self.advance_to(at.max(self.now));
                true
            }
            None => {
                if limit > self.now {
                    self.advance_to(limit);
                }
                false
            }
        }
    }

    fn advance_to(&mut self, at: SimTime) {
        assert!(at >= self.now, "simulated time goes forward");
        if at == self.now {
            self.steps_at_now += 1;
            assert!(
                self.steps_at_now < MAX_STEPS_AT_ONE_TIME,
                "livelock: {MAX_STEPS_AT_ONE_TIME} steps at simulated time {at} ns without time moving \
                 (engine deadline {:?} ns)",
                self.engine.next_deadline().map(|deadline| self.sim_time_of(deadline))
            );
        } else {
            self.steps_at_now = 0;
        }
        self.now = at;
        while self.faults.front().is_some_and(|fault| fault.at <= at) {
            let fault = self.faults.pop_front().expect("checked");
            self.apply_fault(&fault);
        }
        let mut deliveries = std::mem::take(&mut self.deliveries);
        self.cluster.poll(at, &mut deliveries);
        for delivery in deliveries.drain(..) {
            self.deliver(delivery);
        }
        self.deliveries = deliveries;
        let instant = self.instant();
        if self.engine.next_deadline().is_some_and(|deadline| deadline <= instant) {
            self.stats.ticks += 1;
            self.engine.tick(instant, &mut OpTable(&mut self.ops));
            self.settle();
        }
    }

    fn deliver(&mut self, delivery: Delivery) {
        let client_id = self.config.client_id;
        match delivery {
            Delivery::Bytes { client_id: to, node, bytes } => {
                if to != client_id || !self.cluster.is_connected(node, client_id) {
                    // Read before the driver dropped the connection: gone with it.
                    return;
                }
                self.inputs[node].extend_from_slice(&bytes);
                self.parse_frames(node);
            }
            Delivery::ConnectionLost { client_id: to, node } => {
                if to != client_id {
                    return;
                }
                self.stats.connections_lost += 1;
                self.note(|| format!("connection to node {node} lost"));
                self.inputs[node].clear();
                let instant = self.instant();
                self.engine.connection_lost(instant, node, "connection lost", &mut OpTable(&mut self.ops));
            }
        }
        self.settle();
    }

    /// Hands every whole frame of node `node`'s input to the engine.
    fn parse_frames(&mut self, node: NodeId) {
        let input = std::mem::take(&mut self.inputs[node]);
        let mut start = 0;
        let mut violation: Option<String> = None;
        while input.len() - start >= HEADER_BYTES {
            if !self.engine.node(node).connected {
                // The engine gave up on the node while handling an earlier frame.
                start = input.len();
                break;
            }
            let header_bytes: &[u8; HEADER_BYTES] =
                input[start..start + HEADER_BYTES].try_into().expect("HEADER_BYTES long");
            let header = match FrameHeader::decode(header_bytes) {
                Ok(header) => header,
                Err(error) => {
                    violation = Some(format!("undecodable header: {error}"));
                    break;
                }
            };
            let body_len = header.body_len as usize;
            if body_len > self.engine.max_reply_body(header.kind) {
                violation = Some(format!("{:?} frame of {body_len} bytes is too long", header.kind));
                break;
            }
            if input.len() - start < HEADER_BYTES + body_len {
                break;
            }
            let body = &input[start + HEADER_BYTES..start + HEADER_BYTES + body_len];
            start += HEADER_BYTES + body_len;
            self.stats.frames_received += 1;
            let instant = self.instant();
            if let Err(error) = self.engine.on_frame(instant, node, header, body, &mut OpTable(&mut self.ops))
            {
                violation = Some(error.to_string());
                break;
            }
            // Replies may have finished ops or started rebuilds: act on it before the next frame.
            self.settle();
        }
        match violation {
            Some(why) => {
                self.stats.protocol_violations += 1;
                if self.first_violation.is_none() {
                    self.first_violation = Some((self.now, node, why.clone()));
                }
                self.note(|| format!("node {node} broke the protocol: {why}"));
                self.cluster.disconnect(self.now, node, self.config.client_id);
                let instant = self.instant();
                self.engine.connection_lost(instant, node, &why, &mut OpTable(&mut self.ops));
            }
            None => {
                let mut input = input;
                input.drain(..start);
                self.inputs[node] = input;
            }
        }
    }

    /// Runs everything that happens up to `until` (inclusive); the time is then `until`.
    pub fn run_until(&mut self, until: SimTime) {
        while self.step(until) {}
    }

    pub fn run_for(&mut self, duration: SimTime) {
        let until = self.now + duration;
        self.run_until(until);
    }

    /// Runs until `done` holds (checked after every step) or `limit` is reached. True if it held.
    pub fn run_until_condition(&mut self, limit: SimTime, mut done: impl FnMut(&SimDriver) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if !self.step(limit) {
                return done(self);
            }
        }
    }

    /// Runs until every submitted op has completed, or `limit`. True if none is left.
    pub fn run_until_idle(&mut self, limit: SimTime) -> bool {
        self.run_until_condition(limit, |driver| driver.in_flight() == 0)
    }

    /// Runs until no range has an unavailable or rebuilding slab and no rebuild is queued, or
    /// `limit`. True if healed.
    pub fn run_until_healed(&mut self, limit: SimTime) -> bool {
        self.run_until_condition(limit, |driver| driver.is_healed())
    }

    /// No range has an unavailable slab and no rebuild is in flight.
    pub fn is_healed(&self) -> bool {
        !self.engine.has_regenerations()
            && self.engine.ranges().iter().all(|range| range.unavailable == 0 && range.rebuilding == 0)
    }
}
