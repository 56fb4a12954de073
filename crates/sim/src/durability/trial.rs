//! One seeded trial: N nodes in racks, failing and coming back over simulated years, with every
//! lost slab rebuilt where the placement policy says, at the rebuild speed.
//!
//! Events sit in one time-ordered queue; a node's or a slab's events carry an epoch or a
//! rebuild id, and an event whose epoch no longer matches is dropped, so nothing is ever
//! removed from the queue. Per-range state (down slabs, exposure) exists only for ranges with a
//! slab down; a healthy range is its k+r node indices and nothing else.
//!
//! Invariants (asserted): a range's down count equals its slabs in the down map; a node's slab
//! list holds exactly the slabs whose range points at it; a rebuild goes to a live node outside
//! the range (the policy's contract).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem_placement::{NodeLoad, Placement, PlacementError};

use super::exposure::{kill_rate, remaining_time_integral, second_order_rate, Rates};
use super::{Config, TrialResult, SECONDS_PER_YEAR};
use crate::policy::Policy;

/// How long to wait before asking the policy again when no node can take a rebuild.
const RETRY_SECONDS: f64 = 60.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeState {
    Up,
    /// Unreachable, memory intact: its slabs come back if not rebuilt by then.
    Transient,
    /// Memory lost; the machine is replaced (empty) after `replace_hours`.
    Dead,
}

#[derive(Clone, Copy, Debug)]
enum Event {
    /// Permanent failure of the node's current hardware (`install` epoch).
    NodeDies {
        node: u32,
        install: u32,
    },
    /// Transient failure, valid while the node is up in the same `epoch`.
    NodeBlinks {
        node: u32,
        epoch: u32,
    },
    NodeReturns {
        node: u32,
        epoch: u32,
    },
    RackDies {
        rack: u32,
    },
    NodeReplaced {
        node: u32,
    },
    /// The lease timeout: the node's down slabs are declared lost and rebuilt elsewhere.
    Detect {
        node: u32,
        epoch: u32,
    },
    RebuildRetry {
        slot: u32,
    },
    RebuildDone {
        slot: u32,
        rebuild: u64,
    },
}

struct Timed {
    at: f64,
    sequence: u64,
    event: Event,
}

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    /// Reversed, so the std max-heap pops the earliest event; ties in insertion order.
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.total_cmp(&self.at).then(other.sequence.cmp(&self.sequence))
    }
}

struct Node {
    state: NodeState,
    /// Bumped whenever the node goes down or comes back: events of an older epoch are stale.
    epoch: u32,
    /// Bumped when the hardware is replaced.
    install: u32,
    /// Slots (range * width + split) this node holds or is rebuilding.
    slots: Vec<u32>,
    /// When each of its `rebuild_parallel` rebuild lanes is free.
    lanes_free_at: Vec<f64>,
}

/// A slab that is not readable.
#[derive(Clone, Copy, Debug)]
struct DownSlot {
    /// The node that went down with it while transient: if it returns before the rebuild is
    /// done, the slab is back.
    transient_holder: Option<u32>,
    /// Id and end of the rebuild in progress (0: none scheduled).
    rebuild: u64,
    rebuild_done_at: f64,
    /// When the slab was declared lost (lease timeout), for the exposure estimate.
    detect_at: f64,
    since: f64,
}

/// Exposure bookkeeping of a range with slabs down.
#[derive(Clone, Copy, Debug)]
struct Degraded {
    down: usize,
    since: f64,
    first_order: f64,
    second_order: f64,
    ends_at: f64,
    /// Entered by a failure from a degraded state whose second order already counted it.
    credited: bool,
}

pub struct Trial<'a> {
    config: &'a Config,
    width: usize,
    parity_splits: usize,
    rates: Rates,
    rebuild_seconds: f64,
    policy: Box<dyn Placement>,
    rng: StdRng,
    now: f64,
    sequence: u64,
    queue: BinaryHeap<Timed>,
    nodes: Vec<Node>,
    loads: Vec<u64>,
    range_nodes: Vec<u32>,
    down: HashMap<u32, DownSlot>,
    degraded: HashMap<u32, Degraded>,
    /// First-order loss rate of every healthy range together (non-zero only when some range
    /// has more than r slabs in one rack).
    healthy_kill_rate: f64,
    candidates: Vec<NodeLoad>,
    candidate_position: Vec<usize>,
    candidates_stale: bool,
    next_rebuild: u64,
    dead_nodes: usize,
    result: TrialResult,
}

impl<'a> Trial<'a> {
    /// Places the ranges with `policy` on a healthy cluster.
    pub fn new(
        config: &'a Config,
        policy: Policy,
        data_splits: usize,
        parity_splits: usize,
        seed: u64,
    ) -> Result<Self, PlacementError> {
        let width = data_splits + parity_splits;
        let node_count = config.nodes;
        let mut trial = Trial {
            config,
            width,
            parity_splits,
            rates: config.rates(),
            rebuild_seconds: config.rebuild_seconds(),
            policy: policy.build(seed, config.load_balancing_factor),
            rng: StdRng::seed_from_u64(seed ^ 0x5eed),
            now: 0.0,
            sequence: 0,
            queue: BinaryHeap::new(),
            nodes: (0..node_count)
                .map(|_| Node {
                    state: NodeState::Up,
                    epoch: 0,
                    install: 0,
                    slots: Vec::new(),
                    lanes_free_at: vec![0.0; config.rebuild_parallel.max(1)],
                })
                .collect(),
            loads: vec![0; node_count],
            range_nodes: Vec::new(),
            down: HashMap::new(),
            degraded: HashMap::new(),
            healthy_kill_rate: 0.0,
            candidates: Vec::with_capacity(node_count),
            candidate_position: vec![usize::MAX; node_count],
            candidates_stale: true,
            next_rebuild: 1,
            dead_nodes: 0,
            result: TrialResult::default(),
        };
        let range_count = config.nodes * config.slabs_per_node / width;
        trial.range_nodes.reserve(range_count * width);
        for range in 0..range_count {
            trial.refresh_candidates();
            let placed = trial.policy.place(&trial.candidates, width)?;
            assert_eq!(placed.nodes.len(), width, "a policy returns width nodes");
            for (split, &node) in placed.nodes.iter().enumerate() {
                trial.range_nodes.push(node as u32);
                trial.nodes[node].slots.push((range * width + split) as u32);
                trial.add_load(node as u32, 1);
            }
        }
        trial.healthy_kill_rate = (0..range_count as u32).map(|range| trial.healthy_rate(range)).sum();
        for node in 0..node_count as u32 {
            trial.schedule_failures(node);
        }
        for rack in 0..config.rack_count() as u32 {
            let at = trial.lifetime(config.rack_mttf_years);
            trial.push(at, Event::RackDies { rack });
        }
        trial.result.ranges = range_count as u64;
        Ok(trial)
    }

    /// Runs until `years` of simulated time; `progress` is called about once per simulated year
    /// with the years done.
    pub fn run(mut self, years: f64, progress: &mut dyn FnMut(f64)) -> TrialResult {
        let end = years * SECONDS_PER_YEAR;
        let mut next_report = SECONDS_PER_YEAR;
        while let Some(Timed { at, event, .. }) = self.queue.pop() {
            if at > end {
                break;
            }
            self.advance(at);
            self.handle(event);
            if at >= next_report {
                progress(at / SECONDS_PER_YEAR);
                next_report += SECONDS_PER_YEAR;
            }
        }
        self.advance(end);
        let mut ranges: Vec<u32> = self.degraded.keys().copied().collect();
        ranges.sort_unstable();
        for range in ranges {
            self.settle(range);
        }
        self.result.years = years;
        self.result
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::NodeDies { node, install } => {
                if self.nodes[node as usize].install == install
                    && self.nodes[node as usize].state != NodeState::Dead
                {
                    self.kill_nodes(&[node]);
                }
            }
            Event::RackDies { rack } => {
                let size = self.config.rack_size.max(1);
                let first = rack as usize * size;
                let members: Vec<u32> = (first..(first + size).min(self.config.nodes))
                    .filter(|&n| self.nodes[n].state != NodeState::Dead)
                    .map(|n| n as u32)
                    .collect();
                self.result.rack_failures += 1;
                self.kill_nodes(&members);
                let at = self.now + self.lifetime(self.config.rack_mttf_years);
                self.push(at, Event::RackDies { rack });
            }
            Event::NodeBlinks { node, epoch } => {
                let entry = &self.nodes[node as usize];
                if entry.state == NodeState::Up && entry.epoch == epoch {
                    self.result.transient_failures += 1;
                    let lost = self.take_down(node, NodeState::Transient);
                    self.count_event(lost);
                    let duration = -self.config.transient_mean_seconds * (1.0 - self.rng.gen::<f64>()).ln();
                    let epoch = self.nodes[node as usize].epoch;
                    self.push(self.now + duration, Event::NodeReturns { node, epoch });
                }
            }
            Event::NodeReturns { node, epoch } => {
                let entry = &self.nodes[node as usize];
                if entry.state == NodeState::Transient && entry.epoch == epoch {
                    self.node_returns(node);
                }
            }
            Event::NodeReplaced { node } => {
                let entry = &mut self.nodes[node as usize];
                assert_eq!(entry.state, NodeState::Dead, "only a dead node is replaced");
                entry.state = NodeState::Up;
                entry.epoch += 1;
                entry.install += 1;
                entry.lanes_free_at.iter_mut().for_each(|t| *t = 0.0);
                self.dead_nodes -= 1;
                self.candidates_stale = true;
                self.schedule_failures(node);
            }
            Event::Detect { node, epoch } => {
                let entry = &self.nodes[node as usize];
                if entry.epoch == epoch && entry.state != NodeState::Up {
                    let slots: Vec<u32> = entry.slots.clone();
                    for slot in slots {
                        if self.down.get(&slot).is_some_and(|d| d.rebuild == 0) {
                            self.start_rebuild(slot);
                        }
                    }
                }
            }
            Event::RebuildRetry { slot } => {
                if self.down.get(&slot).is_some_and(|d| d.rebuild == 0) {
                    self.start_rebuild(slot);
                }
            }
            Event::RebuildDone { slot, rebuild } => {
                if self.down.get(&slot).is_some_and(|d| d.rebuild == rebuild) {
                    let range = slot / self.width as u32;
                    self.settle(range);
                    let down = self.down.remove(&slot).expect("checked above");
                    self.note_window(self.now - down.since);
                    self.result.rebuilds += 1;
                    self.refresh(range, false);
                }
            }
        }
    }

    fn kill_nodes(&mut self, members: &[u32]) {
        let mut lost = 0;
        for &node in members {
            let was = self.nodes[node as usize].state;
            if was == NodeState::Transient {
                // Its slabs are already down; now they will not come back.
                self.nodes[node as usize].state = NodeState::Dead;
                self.forget_transient_holder(node);
            } else {
                lost += self.take_down(node, NodeState::Dead);
            }
            self.result.node_failures += 1;
            self.dead_nodes += 1;
            self.result.peak_dead_nodes = self.result.peak_dead_nodes.max(self.dead_nodes as u64);
            let at = self.now + self.config.replace_hours * 3600.0;
            self.push(at, Event::NodeReplaced { node });
        }
        self.count_event(lost);
    }

    fn count_event(&mut self, lost_ranges: u64) {
        if lost_ranges > 0 {
            self.result.loss_events += 1;
            self.result.ranges_lost += lost_ranges;
        }
    }

    /// The node stops serving: every slab it holds or is rebuilding goes down. Returns the
    /// ranges this loses (those that now have more than r slabs down).
    fn take_down(&mut self, node: u32, state: NodeState) -> u64 {
        let entry = &mut self.nodes[node as usize];
        entry.state = state;
        entry.epoch += 1;
        // A rebuild this node was doing is lost with it; its lanes start empty when it returns.
        entry.lanes_free_at.iter_mut().for_each(|t| *t = 0.0);
        let epoch = entry.epoch;
        let slots = entry.slots.clone();
        self.candidates_stale = true;
        let mut lost = 0;
        let detect_at = self.now + self.config.detect_seconds;
        for slot in slots {
            let range = slot / self.width as u32;
            self.settle(range);
            let transient_holder = (state == NodeState::Transient).then_some(node);
            let newly_down = match self.down.get_mut(&slot) {
                Some(down) => {
                    // A rebuild onto this node: lost, to be placed again after the timeout.
                    down.rebuild = 0;
                    down.detect_at = detect_at;
                    false
                }
                None => {
                    self.down.insert(
                        slot,
                        DownSlot {
                            transient_holder,
                            rebuild: 0,
                            rebuild_done_at: 0.0,
                            detect_at,
                            since: self.now,
                        },
                    );
                    true
                }
            };
            let before = self.degraded.get(&range).map_or(0, |d| d.down);
            self.refresh(range, newly_down);
            if newly_down && before <= self.parity_splits && before + 1 > self.parity_splits {
                lost += 1;
            }
        }
        self.push(detect_at, Event::Detect { node, epoch });
        lost
    }

    fn node_returns(&mut self, node: u32) {
        let entry = &mut self.nodes[node as usize];
        entry.state = NodeState::Up;
        entry.epoch += 1;
        self.candidates_stale = true;
        // Slabs still on it (not rebuilt yet, or not even detected) are readable again.
        let slots = entry.slots.clone();
        let mut lost_rebuilds = Vec::new();
        for slot in slots {
            match self.down.get(&slot) {
                Some(d) if d.transient_holder == Some(node) => self.restore(slot),
                // A rebuild it was doing, lost when it went away: placed again now.
                Some(d) if d.rebuild == 0 => lost_rebuilds.push(slot),
                _ => {}
            }
        }
        // Slabs being rebuilt elsewhere from its copy: the rebuild is cancelled, the slab stays.
        let mut moved: Vec<u32> = self
            .down
            .iter()
            .filter(|(_, d)| d.transient_holder == Some(node))
            .map(|(&slot, _)| slot)
            .collect();
        // In slot order, not hash order, so that a seed replays exactly.
        moved.sort_unstable();
        for slot in moved {
            let destination = self.range_nodes[slot as usize];
            self.move_slot(slot, destination, node);
            self.restore(slot);
        }
        for slot in lost_rebuilds {
            if self.down.get(&slot).is_some_and(|d| d.rebuild == 0) {
                self.start_rebuild(slot);
            }
        }
        self.schedule_blink(node);
    }

    fn forget_transient_holder(&mut self, node: u32) {
        for down in self.down.values_mut() {
            if down.transient_holder == Some(node) {
                down.transient_holder = None;
            }
        }
    }

    fn restore(&mut self, slot: u32) {
        let range = slot / self.width as u32;
        self.settle(range);
        let down = self.down.remove(&slot).expect("restoring a down slab");
        self.note_window(self.now - down.since);
        self.result.slabs_returned += 1;
        self.refresh(range, false);
    }

    /// Asks the policy where the slab goes and queues its rebuild on that node.
    fn start_rebuild(&mut self, slot: u32) {
        let range = (slot / self.width as u32) as usize;
        self.refresh_candidates();
        let current: Vec<usize> = self.range_nodes[range * self.width..(range + 1) * self.width]
            .iter()
            .map(|&n| n as usize)
            .collect();
        let destination = match self.policy.replace(&self.candidates, &current) {
            Ok(node) => node as u32,
            Err(_) => {
                self.result.rebuild_retries += 1;
                self.push(self.now + RETRY_SECONDS, Event::RebuildRetry { slot });
                return;
            }
        };
        assert!(!current.contains(&(destination as usize)), "a replacement is outside the range");
        assert_eq!(self.nodes[destination as usize].state, NodeState::Up, "a replacement is live");
        let holder = self.range_nodes[slot as usize];
        self.move_slot(slot, holder, destination);
        let lanes = &mut self.nodes[destination as usize].lanes_free_at;
        let lane =
            (0..lanes.len()).min_by(|&a, &b| lanes[a].total_cmp(&lanes[b])).expect("at least one lane");
        let start = lanes[lane].max(self.now);
        let done_at = start + self.rebuild_seconds;
        lanes[lane] = done_at;
        self.result.rebuild_wait_seconds_max = self.result.rebuild_wait_seconds_max.max(start - self.now);
        let rebuild = self.next_rebuild;
        self.next_rebuild += 1;
        let range = range as u32;
        self.settle(range);
        let down = self.down.get_mut(&slot).expect("rebuilding a down slab");
        down.rebuild = rebuild;
        down.rebuild_done_at = done_at;
        self.refresh(range, false);
        self.push(done_at, Event::RebuildDone { slot, rebuild });
    }

    fn move_slot(&mut self, slot: u32, from: u32, to: u32) {
        let slots = &mut self.nodes[from as usize].slots;
        let position = slots.iter().position(|&s| s == slot).expect("a node lists its slabs");
        slots.swap_remove(position);
        self.nodes[to as usize].slots.push(slot);
        self.range_nodes[slot as usize] = to;
        self.add_load(from, -1);
        self.add_load(to, 1);
    }

    fn add_load(&mut self, node: u32, delta: i64) {
        let load = &mut self.loads[node as usize];
        *load = load.saturating_add_signed(delta);
        let position = self.candidate_position[node as usize];
        if position != usize::MAX {
            self.candidates[position].slabs_mapped = *load;
        }
    }

    /// The live nodes as the policy sees them; a node that is down is absent.
    fn refresh_candidates(&mut self) {
        if !self.candidates_stale {
            return;
        }
        self.candidates.clear();
        self.candidate_position.iter_mut().for_each(|p| *p = usize::MAX);
        for (index, node) in self.nodes.iter().enumerate() {
            if node.state == NodeState::Up {
                self.candidate_position[index] = self.candidates.len();
                self.candidates.push(NodeLoad {
                    node_index: index,
                    failure_domain: self.config.domain_label(index),
                    slabs_mapped: self.loads[index],
                    slabs_free: u64::MAX,
                });
            }
        }
        self.candidates_stale = false;
    }

    fn racks_of(&self, range: u32, live_only: bool) -> Vec<u32> {
        let first = range as usize * self.width;
        (first..first + self.width)
            .filter(|&slot| !live_only || !self.down.contains_key(&(slot as u32)))
            .map(|slot| self.config.rack_of(self.range_nodes[slot] as usize))
            .collect()
    }

    fn healthy_rate(&self, range: u32) -> f64 {
        kill_rate(0, &self.racks_of(range, false), self.parity_splits, self.rates)
    }

    /// Adds the range's exposure since its last change (before the change is applied).
    fn settle(&mut self, range: u32) {
        let Some(state) = self.degraded.get_mut(&range) else { return };
        let elapsed = self.now - state.since;
        self.result.expected_first_order += state.first_order * elapsed;
        if !state.credited {
            self.result.expected_ranges_lost += state.first_order * elapsed;
        }
        self.result.expected_ranges_lost +=
            state.second_order * remaining_time_integral(state.since, self.now, state.ends_at);
        state.since = self.now;
    }

    /// Recomputes the range's exposure after a change. `failed` says the change was a failure
    /// taking one more slab down (as opposed to a slab coming back).
    fn refresh(&mut self, range: u32, failed: bool) {
        let first = range as usize * self.width;
        let mut down = 0;
        let mut ends_at = f64::INFINITY;
        for slot in first as u32..(first + self.width) as u32 {
            if let Some(d) = self.down.get(&slot) {
                down += 1;
                let back =
                    if d.rebuild != 0 { d.rebuild_done_at } else { d.detect_at + self.rebuild_seconds };
                ends_at = ends_at.min(back);
            }
        }
        let previous = self.degraded.get(&range).copied();
        if down == 0 {
            if previous.is_some() {
                self.degraded.remove(&range);
                self.healthy_kill_rate += self.healthy_rate(range);
            }
            return;
        }
        if previous.is_none() {
            self.healthy_kill_rate -= self.healthy_rate(range);
        }
        let live = self.racks_of(range, true);
        // A lost range (more than r down) cannot be lost again until a slab comes back.
        let exposed = down <= self.parity_splits;
        let credited = match previous {
            // Into a state the second order of the previous state already counted.
            Some(p) if failed => p.second_order > 0.0 || p.credited && p.down == down,
            Some(p) => p.credited && p.down == down,
            None => false,
        };
        self.degraded.insert(
            range,
            Degraded {
                down,
                since: self.now,
                first_order: if exposed {
                    kill_rate(down, &live, self.parity_splits, self.rates)
                } else {
                    0.0
                },
                second_order: if exposed {
                    second_order_rate(down, &live, self.parity_splits, self.rates)
                } else {
                    0.0
                },
                ends_at,
                credited,
            },
        );
    }

    /// Moves the clock, adding the healthy ranges' exposure.
    fn advance(&mut self, at: f64) {
        let elapsed = at - self.now;
        self.result.expected_first_order += self.healthy_kill_rate.max(0.0) * elapsed;
        self.result.expected_ranges_lost += self.healthy_kill_rate.max(0.0) * elapsed;
        self.now = at;
    }

    fn note_window(&mut self, seconds: f64) {
        self.result.down_windows += 1;
        self.result.down_seconds_total += seconds;
        self.result.down_seconds_max = self.result.down_seconds_max.max(seconds);
    }

    fn schedule_failures(&mut self, node: u32) {
        let install = self.nodes[node as usize].install;
        let at = self.now + self.lifetime(self.config.node_mttf_years);
        self.push(at, Event::NodeDies { node, install });
        self.schedule_blink(node);
    }

    fn schedule_blink(&mut self, node: u32) {
        if self.config.transient_mttf_years > 0.0 {
            let epoch = self.nodes[node as usize].epoch;
            let at = self.now
                - self.config.transient_mttf_years * SECONDS_PER_YEAR * (1.0 - self.rng.gen::<f64>()).ln();
            self.push(at, Event::NodeBlinks { node, epoch });
        }
    }

    /// A lifetime in seconds with mean `mean_years`: exponential, or Weibull with the
    /// configured shape and the same mean. Zero or less means never.
    fn lifetime(&mut self, mean_years: f64) -> f64 {
        if mean_years <= 0.0 {
            return f64::INFINITY;
        }
        let mean = mean_years * SECONDS_PER_YEAR;
        let exponential = -(1.0 - self.rng.gen::<f64>()).ln();
        match self.config.weibull_shape {
            None => mean * exponential,
            Some(shape) => mean / super::gamma(1.0 + 1.0 / shape) * exponential.powf(1.0 / shape),
        }
    }

    fn push(&mut self, at: f64, event: Event) {
        if at.is_finite() {
            self.sequence += 1;
            self.queue.push(Timed { at, sequence: self.sequence, event });
        }
    }

    /// Checks the bookkeeping invariants (tests call it between steps).
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
        for (index, node) in self.nodes.iter().enumerate() {
            for &slot in &node.slots {
                assert_eq!(self.range_nodes[slot as usize] as usize, index, "slot {slot} listed on {index}");
            }
        }
        let listed: usize = self.nodes.iter().map(|n| n.slots.len()).sum();
        assert_eq!(listed, self.range_nodes.len(), "every slab on exactly one node");
        for (&range, state) in &self.degraded {
            let first = range * self.width as u32;
            let down = (first..first + self.width as u32).filter(|s| self.down.contains_key(s)).count();
            assert_eq!(state.down, down, "range {range} down count");
        }
        for &slot in self.down.keys() {
            assert!(
                self.degraded.contains_key(&(slot / self.width as u32)),
                "a down slab's range is degraded"
            );
        }
    }

    /// Test hooks: fail a rack or a node now, and run the queue until `until` seconds.
    #[cfg(test)]
    pub(super) fn fail_rack_now(&mut self, rack: u32) {
        self.handle(Event::RackDies { rack });
    }

    #[cfg(test)]
    pub(super) fn run_quiet_until(&mut self, until: f64) {
        while self.queue.peek().is_some_and(|t| t.at <= until) {
            let Timed { at, event, .. } = self.queue.pop().expect("peeked");
            self.advance(at);
            self.handle(event);
            self.check_invariants();
        }
        self.advance(until);
    }

    #[cfg(test)]
    pub(super) fn result(&self) -> &TrialResult {
        &self.result
    }

    #[cfg(test)]
    pub(super) fn range_nodes(&self) -> &[u32] {
        &self.range_nodes
    }
}
