//! The scenario runner: from one seed, a cluster, a client with one or more regions, a mixed
//! workload checked against a reference model, and a plan of faults, run in simulated time by
//! [`SimDriver`] (the idea of TigerBeetle's VOPR; the code is our own).
//!
//! A seed decides everything ([`ScenarioPlan::generate`]): 12 to 14 nodes, one failure domain
//! each, 16 KiB slabs (so a range is 4 to 32 pages and a rebuild takes well under a millisecond of
//! simulated time); an EC(8,2) region with delta 1, sometimes also a rep(3) region (k=1, r=2) and
//! an EC(4,2) one; the placement policy (LeastLoaded, or CodingSets when every region has one
//! width); a lowered corruption threshold half of the time; 150 to 300 reads and writes of random
//! pages at random times; faults from [`FaultSchedule::within_tolerance`] or
//! [`FaultSchedule::beyond_tolerance`] (every kind: kill, restart empty, stall shorter and longer
//! than the request timeout, partition, straggler, bit flips, eviction, dropped writes), and
//! sometimes a client crash with torn writes, then a reopen from the saved slab map, after which
//! the runner reads and then rewrites the pages whose writes the crash cut (an application
//! recovering its journal would). In half the seeds (`ScenarioPlan::eor`, drawn apart so that the
//! other half run exactly as before) the workload also writes pages data splits only and later
//! completes them with their parities (EC-oriented replication, as `remem kv` does); the pages
//! still parity-stale at a crash are read and rewritten whole with the torn ones.
//!
//! Every region has r = 2, so a within-tolerance plan (at most 2 faulty nodes over the whole run,
//! one episode each) never has more than r faulty slabs in a range; a slab rebuilt elsewhere no
//! longer counts, which the end of the run checks by killing r more nodes.
//!
//! The model (`model.rs`): per page, the generations a read may return (0 = never written:
//! zeros), whether a read may fail, and whether the page is parity-stale. Page bytes are a
//! pattern of (page, generation) that names both in its first 16 bytes, so a wrong read says what
//! it returned. The checks:
//!
//! - within tolerance: every whole write succeeds and every read returns exactly the model's
//!   generation, except that a parity-stale page survives no data-slab loss (a read of it may
//!   fail, never decode, never return wrong bytes) and data-only and parity writes may fail;
//!   pages torn by a client crash may read as old, new or an error (never a mix), until
//!   rewritten. After the workload the faults heal (stragglers end, the rest ran out) and only
//!   ticks run: every range must get back to no unavailable slab, no rebuild left (rebuilds that
//!   cannot bring parity-stale pages back complete all the same), every reachable node
//!   connected; the engine's slab map must match the cluster's slabs (and, without a crash, no
//!   slab of ours may be leaked); parity-stale pages then get their parities, or are written
//!   whole where that is refused; every page must read back; then r more nodes are
//!   killed and every page must still read back (healing restored full redundancy). A node whose
//!   bits were flipped still counts against those r: a corrupt split below the corruption
//!   threshold is an erasure at every read and nothing repairs it until its page is rewritten;
//! - beyond tolerance: errors are allowed, wrong data never: a read that returns `Ok` returns a
//!   generation the model allows (after a client crash: one that was written);
//! - always: every op completes (no hang), and no node ever sends a frame the engine rejects.
//!
//! Replay: a failing seed prints its plan and a one-line command, e.g.
//! `REMEM_SIM_SEED=1234 REMEM_SIM_TOLERANCE=within cargo nextest run -p remem-simnet --test
//! scenarios replay_seed_from_env --no-capture`, which runs just that seed and prints the trace of
//! what happened (ops, faults, connections, slab requests, failed ops); with `REMEM_SIM_LOG=1`
//! the trace is printed as it happens, between the engine's own log lines.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::driver::{Completion, SimDriver, SimOp, SimOpKind};
use crate::schedule::FaultAction;
use crate::{NetworkOptions, SimCluster, SimTime, SECOND};

mod model;
mod plan;
use model::{PageModel, Pending};
pub use plan::*;

/// Bytes of a page in every scenario.
pub const PAGE_BYTES: usize = 4096;
/// Slab size of every node: 32 pages per EC(8,2) range, 16 per EC(4,2), 4 per rep(3).
pub const SLAB_BYTES: u64 = 16 * 1024;
/// The parity splits of every region of every plan, so one fault plan fits them all.
pub const R: usize = 2;
/// How long a heal may take in simulated time before the run counts as stuck.
const HEAL_LIMIT: SimTime = 60 * SECOND;
/// Longest an op may stay unfinished after the workload (every wait is bounded by timeouts).
const DRAIN_LIMIT: SimTime = 10 * SECOND;

/// The bytes of `page` at `generation` (>= 1): page and generation in the first 16 bytes, then a
/// stream of both, so that any mix of two generations matches neither.
pub fn page_pattern(page: u64, generation: u64) -> Vec<u8> {
    let mut data = vec![0u8; PAGE_BYTES];
    data[..8].copy_from_slice(&page.to_le_bytes());
    data[8..16].copy_from_slice(&generation.to_le_bytes());
    let mut state = page.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ generation.wrapping_mul(0xD1B5_4A32_D192_ED03);
    for chunk in data[16..].chunks_mut(8) {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
    data
}

/// What a read returned: `Some((page, generation))` if the bytes are exactly a pattern (or all
/// zeros: generation 0 of the page asked), `None` for anything else (a mix, garbage).
pub fn identify(asked_page: u64, data: &[u8]) -> Option<(u64, u64)> {
    if data.iter().all(|byte| *byte == 0) {
        return Some((asked_page, 0));
    }
    let page = u64::from_le_bytes(data[..8].try_into().ok()?);
    let generation = u64::from_le_bytes(data[8..16].try_into().ok()?);
    (generation >= 1 && data == page_pattern(page, generation).as_slice()).then_some((page, generation))
}

/// One run of a plan.
struct Run<'a> {
    plan: &'a ScenarioPlan,
    driver: SimDriver,
    pages: Vec<PageModel>,
    pending: std::collections::BTreeMap<u64, Pending>,
    report: ScenarioReport,
    crashed: bool,
    rng: StdRng,
    /// Chooses data-only and parity writes, apart from `rng` so that a plan without them runs
    /// exactly as before they existed.
    eor_rng: StdRng,
}

/// Runs the scenario of `seed`. With `trace` the failure carries the driver's trace.
pub fn run_seed(seed: u64, tolerance: Tolerance, trace: bool) -> Result<ScenarioReport, ScenarioFailure> {
    let plan = ScenarioPlan::generate(seed, tolerance);
    run_plan(&plan, if trace { Trace::Keep } else { Trace::Off })
}

/// What a run keeps of what happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trace {
    Off,
    /// Kept for the failure report.
    Keep,
    /// Kept and printed as it happens (with every op), to read next to the engine's logs.
    Echo,
}

/// Runs one plan: see the module documentation for what is checked.
pub fn run_plan(plan: &ScenarioPlan, trace: Trace) -> Result<ScenarioReport, ScenarioFailure> {
    run_plan_with(plan, trace, |_| {})
}

/// [`run_plan`], handing the driver to `inspect` at the end (pass or fail), for checks of the
/// run itself (its trace, its statistics).
pub fn run_plan_with(
    plan: &ScenarioPlan,
    trace: Trace,
    inspect: impl FnOnce(&SimDriver),
) -> Result<ScenarioReport, ScenarioFailure> {
    let mut cluster = SimCluster::new(plan.seed, NetworkOptions::default());
    for node in 0..plan.node_count {
        cluster.add_node(format!("d{node}"), plan.capacity_slabs, SLAB_BYTES);
    }
    let mut driver = SimDriver::new(cluster, plan.engine_config(), plan.placement, plan.seed ^ 0x91AC_E000);
    match trace {
        Trace::Off => {}
        Trace::Keep => driver.enable_trace(),
        Trace::Echo => driver.echo_trace(),
    }
    let mut run = Run {
        plan,
        driver,
        pages: Vec::new(),
        pending: std::collections::BTreeMap::new(),
        report: ScenarioReport::default(),
        crashed: false,
        rng: StdRng::seed_from_u64(plan.seed ^ 0x3017_4C0A_D000_0003),
        eor_rng: StdRng::seed_from_u64(plan.seed ^ 0xE0E0_2A11_D000_0004),
    };
    let result = run.execute();
    inspect(&run.driver);
    let failure = |message: String| ScenarioFailure {
        seed: plan.seed,
        tolerance: plan.tolerance,
        message,
        plan: plan.to_string(),
        trace: run.driver.trace(),
    };
    match result {
        Ok(()) => {
            run.report.faults = run.driver.fault_tally();
            run.report.rebuilds_done = run.driver.engine().regeneration_status().done;
            run.report.simulated_ns = run.driver.now();
            run.report.torn_messages = run.driver.cluster().fault_counts().in_flight_messages_dropped;
            Ok(run.report)
        }
        Err(message) => Err(failure(message)),
    }
}

impl Run<'_> {
    fn execute(&mut self) -> Result<(), String> {
        for &(shape, pages) in &self.plan.regions {
            self.driver.create_region(shape, pages).map_err(|error| format!("setup: {error}"))?;
        }
        self.pages = vec![PageModel::new(); self.driver.engine().page_count() as usize];
        let start = self.driver.now();
        let faults: Vec<_> = self
            .plan
            .schedule
            .faults
            .iter()
            .map(|fault| crate::ScheduledFault { at: start + fault.at, ..*fault })
            .collect();
        self.driver.schedule_faults(&faults);
        self.workload(start)?;
        if !self.driver.run_until_idle(self.driver.now() + DRAIN_LIMIT) {
            return Err(format!("{} ops never completed (a hang)", self.driver.in_flight()));
        }
        self.absorb()?;
        // Faults planned past the workload still happen (a restart after a kill, say).
        let last_fault = faults.last().map_or(0, |fault| fault.at);
        self.driver.run_until(last_fault.max(self.driver.now()));
        self.absorb()?;
        match self.plan.tolerance {
            Tolerance::Within => self.heal_and_verify(),
            Tolerance::Beyond => self.verify_every_page(),
        }
    }

    fn workload(&mut self, start: SimTime) -> Result<(), String> {
        let crash_at = self.plan.crash.map(|crash| start + crash.at);
        let mut time = start;
        let page_count = self.pages.len() as u64;
        for _ in 0..self.plan.ops {
            time += self.rng.gen_range(0..=self.plan.op_gap_max);
            if let (Some(at), false) = (crash_at, self.crashed) {
                if at <= time {
                    self.driver.run_until(at);
                    self.absorb()?;
                    self.crash_and_reopen()?;
                }
            }
            self.driver.run_until(time.max(self.driver.now()));
            self.absorb()?;
            while self.driver.in_flight() >= self.plan.max_in_flight {
                let limit = self.driver.now() + DRAIN_LIMIT;
                if !self.driver.step(limit) {
                    return Err(format!("{} ops stuck for {DRAIN_LIMIT} ns", self.driver.in_flight()));
                }
                self.absorb()?;
            }
            let page = self.rng.gen_range(0..page_count);
            if self.pages[page as usize].busy > 0 {
                continue;
            }
            if self.rng.gen_range(0..100) < self.plan.write_percent {
                self.submit_workload_write(page);
            } else {
                self.submit_read(page);
            }
        }
        Ok(())
    }

    /// A write of the workload: whole, or with EOR in the plan sometimes data-only, or the
    /// parity write of a parity-stale page whose content the model knows exactly.
    fn submit_workload_write(&mut self, page: u64) {
        if !self.plan.eor {
            return self.submit_write(page);
        }
        let model = &self.pages[page as usize];
        match (model.parity_stale, model.exact()) {
            (true, Some(generation)) if self.eor_rng.gen_bool(0.5) => {
                self.submit_write_parity(page, generation)
            }
            _ if self.eor_rng.gen_ratio(2, 5) => self.submit_write_of(page, SimOpKind::WriteData),
            _ => self.submit_write(page),
        }
    }

    /// A whole write of the page's next generation.
    fn submit_write(&mut self, page: u64) {
        self.submit_write_of(page, SimOpKind::Write);
    }

    fn submit_write_of(&mut self, page: u64, kind: SimOpKind) {
        let model = &mut self.pages[page as usize];
        let generation = model.next_generation;
        model.next_generation += 1;
        model.written.push(generation);
        model.busy += 1;
        let data = page_pattern(page, generation);
        let op = match kind {
            SimOpKind::Write => SimOp::Write { page, data },
            SimOpKind::WriteData => SimOp::WriteData { page, data },
            _ => unreachable!("a new generation is written whole or data-only"),
        };
        let id = self.driver.submit(op);
        self.driver.note(|| format!("op {id}: {kind:?} page {page} generation {generation}"));
        self.pending.insert(id, Pending { page, kind, generation: Some(generation) });
    }

    /// The parities of parity-stale `page`, which holds `generation`.
    fn submit_write_parity(&mut self, page: u64, generation: u64) {
        self.pages[page as usize].busy += 1;
        let id = self.driver.submit(SimOp::WriteParity { page, data: page_pattern(page, generation) });
        self.driver.note(|| format!("op {id}: WriteParity page {page} generation {generation}"));
        let kind = SimOpKind::WriteParity;
        self.pending.insert(id, Pending { page, kind, generation: Some(generation) });
    }

    fn submit_read(&mut self, page: u64) {
        self.pages[page as usize].busy += 1;
        let id = self.driver.submit(SimOp::Read { page });
        self.driver.note(|| format!("op {id}: read page {page}"));
        self.pending.insert(id, Pending { page, kind: SimOpKind::Read, generation: None });
    }

    /// Checks every completion against the model and updates it.
    fn absorb(&mut self) -> Result<(), String> {
        for completion in self.driver.take_completed() {
            self.check(completion)?;
        }
        if let Some((at, node, why)) = self.driver.first_protocol_violation() {
            return Err(format!(
                "at {at} ns: the engine rejected a frame of node {node} as a protocol violation and dropped \
                 the node: {why}"
            ));
        }
        Ok(())
    }

    /// The client crashes and reopens its saved map; the pages it was writing are read (old,
    /// new or an error, never a mix) and written again, as an application recovering would.
    fn crash_and_reopen(&mut self) -> Result<(), String> {
        let crash = self.plan.crash.expect("a crash is planned");
        // The crash cuts a burst of writes in the middle of their fan-out (one-way delays are
        // 10..30 us), so that some splits land and others do not: torn pages.
        let page_count = self.pages.len() as u64;
        for _ in 0..self.plan.max_in_flight {
            let page = self.rng.gen_range(0..page_count);
            if self.pages[page as usize].busy == 0 {
                self.submit_workload_write(page);
            }
        }
        self.driver.run_for(self.rng.gen_range(0..=crash.cut_after));
        self.absorb()?;
        self.crashed = true;
        let abandoned = self.driver.crash_client(crash.fate, crash.downtime);
        let mut torn: Vec<u64> = Vec::new();
        for op in abandoned {
            let pending = self.pending.remove(&op.id).expect("abandoned ops were submitted");
            let model = &mut self.pages[pending.page as usize];
            model.busy -= 1;
            if let Some(generation) = pending.generation {
                if !model.acceptable.contains(&generation) {
                    model.acceptable.push(generation);
                }
                model.may_fail = true;
                torn.push(pending.page);
            }
        }
        // The reopened client does not know which pages are parity-stale. Until it finds out
        // (a read) or they are written whole, a data-slab loss makes them unreadable unnoticed:
        // treat them like torn pages, read them (any generation written, or an error) and write
        // them again. (A rep(n) rebuild may even have put an older version back on the data
        // split, which the restarted client can no longer tell from the newest.)
        for (page, model) in self.pages.iter_mut().enumerate() {
            if model.parity_stale {
                model.parity_stale = false;
                model.acceptable = model.written.clone();
                model.may_fail = true;
                torn.push(page as u64);
            }
        }
        self.driver.reopen();
        torn.sort_unstable();
        torn.dedup();
        for page in torn {
            self.submit_read(page);
            self.submit_write(page);
        }
        Ok(())
    }

    /// Within tolerance: heal, then check the map, leaks, every page, and every page again with
    /// r more nodes dead.
    fn heal_and_verify(&mut self) -> Result<(), String> {
        let now = self.driver.now();
        for node in 0..self.driver.cluster().node_count() {
            if self.driver.cluster().node_state(node).extra_delay_ns > 0
                || self.driver.cluster().node_state(node).extra_jitter_ns > 0
            {
                self.driver.cluster_mut().set_extra_delay(now, node, 0, 0).expect("the node exists");
            }
        }
        // Stalls and partitions end by themselves; healing is judged once they have.
        let outages_end = (0..self.driver.cluster().node_count())
            .map(|node| {
                let state = self.driver.cluster().node_state(node);
                state.stalled_until.max(state.partitioned_until)
            })
            .max()
            .unwrap_or(0);
        // A connection cut silently (a partition nobody reported) is found by the next heartbeat
        // going unanswered: give the engine that long to learn of every fault before judging.
        let config = self.driver.config();
        let detection = 2 * (config.heartbeat_interval + config.request_timeout).as_nanos() as SimTime;
        self.driver.run_until(outages_end.max(now) + detection);
        self.absorb()?;
        let limit = self.driver.now() + HEAL_LIMIT;
        let healed = self
            .driver
            .run_until_condition(limit, |driver| driver.is_healed() && reachable_connected(driver));
        self.absorb()?;
        if !healed {
            return Err(self.not_healed());
        }
        // Unmaps of slabs released on reconnection are on the wire: let them land.
        self.driver.run_for(self.driver.config().request_timeout.as_nanos() as SimTime);
        self.absorb()?;
        let disagreements = self.driver.map_disagreements();
        if !disagreements.is_empty() {
            return Err(format!(
                "the engine's slab map and the cluster disagree: {}",
                disagreements.join("; ")
            ));
        }
        if !self.crashed {
            // The one leak the engine knows it causes: a `MapSlab` whose node failed before
            // answering may still be carried out when the node resumes (counted by the engine).
            let leaked = self.driver.leaked_slabs();
            if leaked.len() as u64 > self.driver.engine().maps_abandoned() {
                return Err(format!(
                    "slabs of ours no range names (node, slab): {leaked:?}, {} mappings abandoned",
                    self.driver.engine().maps_abandoned()
                ));
            }
        }
        self.complete_pages()?;
        self.verify_every_page()?;
        // Reading every page may have found corrupt splits (and started rebuilds): heal again.
        if !self.driver.run_until_healed(self.driver.now() + HEAL_LIMIT) {
            return Err("not healed again after the verification reads".to_owned());
        }
        self.absorb()?;
        // Healing must have restored full redundancy: r more nodes may die now.
        let holders: Vec<usize> = (0..self.driver.cluster().node_count())
            .filter(|&node| {
                self.driver.cluster().is_alive(node)
                    && self
                        .driver
                        .engine()
                        .ranges()
                        .iter()
                        .any(|range| range.slabs.iter().any(|slab| slab.node == node))
            })
            .collect();
        // A flipped bit below the corruption threshold stays until its page is rewritten (reads
        // take another split; nothing repairs it), so a node with flips still counts as faulty.
        let mut flipping: Vec<usize> = self
            .plan
            .schedule
            .faults
            .iter()
            .filter(|fault| matches!(fault.action, FaultAction::FlipBits { .. }))
            .map(|fault| fault.node)
            .collect();
        flipping.dedup();
        let mut victims = Vec::new();
        for _ in 0..R.saturating_sub(flipping.len()) {
            let candidates: Vec<usize> =
                holders.iter().copied().filter(|node| !victims.contains(node)).collect();
            if let Some(&node) = candidates.get(self.rng.gen_range(0..candidates.len().max(1))) {
                victims.push(node);
            }
        }
        let now = self.driver.now();
        for &node in &victims {
            // Straight on the cluster: the check's kills are not faults of the plan's tally.
            self.driver
                .cluster_mut()
                .kill(now, node)
                .map_err(|error| format!("redundancy check: {error}"))?;
            self.report.redundancy_kills += 1;
        }
        self.driver.note(|| format!("redundancy check: killed nodes {victims:?}"));
        self.verify_every_page()
    }

    /// Why the cluster is not healed: the ranges still short of slabs, the rebuilds, and the
    /// reachable nodes the engine is not connected to.
    fn not_healed(&self) -> String {
        let ranges: Vec<String> = self
            .driver
            .engine()
            .ranges()
            .iter()
            .enumerate()
            .filter(|(_, range)| range.unavailable != 0 || range.rebuilding != 0)
            .map(|(index, range)| {
                format!(
                    "range {index}: unavailable {:#b} rebuilding {:#b}",
                    range.unavailable, range.rebuilding
                )
            })
            .collect();
        let disconnected: Vec<usize> = (0..self.driver.cluster().node_count())
            .filter(|&node| node_reachable(&self.driver, node) && !self.driver.engine().node(node).connected)
            .collect();
        format!(
            "not healed after {HEAL_LIMIT} ns of ticks: [{}], {:?}, reachable nodes not connected: {disconnected:?}",
            ranges.join("; "),
            self.driver.engine().regeneration_status()
        )
    }

    /// Within tolerance, after healing: what the workload left half done is completed, as an
    /// application would before counting on full redundancy. A parity-stale page whose content
    /// the model knows gets its parities; if that is refused (a data split of it was lost) or
    /// the content is uncertain (a data-only write failed), the page is written whole.
    fn complete_pages(&mut self) -> Result<(), String> {
        for page in 0..self.pages.len() as u64 {
            let model = &self.pages[page as usize];
            if let (true, Some(generation)) = (model.parity_stale, model.exact()) {
                self.submit_write_parity(page, generation);
                self.wait_for_room("parity writes")?;
            }
        }
        self.drain("parity writes")?;
        for page in 0..self.pages.len() as u64 {
            let model = &self.pages[page as usize];
            if model.parity_stale || model.may_fail {
                self.submit_write(page);
                self.wait_for_room("completing writes")?;
            }
        }
        self.drain("completing writes")
    }

    /// Reads every page once and checks it against the model.
    fn verify_every_page(&mut self) -> Result<(), String> {
        for page in 0..self.pages.len() as u64 {
            self.submit_read(page);
            self.report.pages_verified += 1;
            self.wait_for_room("verification reads")?;
        }
        self.drain("verification reads")
    }

    /// Runs until fewer than `max_in_flight` ops are in flight.
    fn wait_for_room(&mut self, what: &str) -> Result<(), String> {
        while self.driver.in_flight() >= self.plan.max_in_flight {
            let limit = self.driver.now() + DRAIN_LIMIT;
            if !self.driver.step(limit) {
                return Err(format!("{what} stuck for {DRAIN_LIMIT} ns"));
            }
            self.absorb()?;
        }
        Ok(())
    }

    /// Runs until every op completed, and checks them.
    fn drain(&mut self, what: &str) -> Result<(), String> {
        if !self.driver.run_until_idle(self.driver.now() + DRAIN_LIMIT) {
            return Err(format!("{} {what} never completed", self.driver.in_flight()));
        }
        self.absorb()
    }
}

/// A node the client could reach now: alive, not stalled, not partitioned.
fn node_reachable(driver: &SimDriver, node: usize) -> bool {
    let now = driver.now();
    let cluster = driver.cluster();
    cluster.is_alive(node) && !cluster.is_stalled(node, now) && !cluster.is_partitioned(node, now)
}

/// Every reachable member node is connected in the engine.
fn reachable_connected(driver: &SimDriver) -> bool {
    (0..driver.cluster().node_count()).all(|node| {
        !node_reachable(driver, node)
            || driver.engine().node(node).connected
            || driver.engine().node(node).membership == remem_client::engine::Membership::Removed
    })
}
