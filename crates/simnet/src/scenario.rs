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
//! recovering its journal would).
//!
//! Every region has r = 2, so a within-tolerance plan (at most 2 faulty nodes over the whole run,
//! one episode each) never has more than r faulty slabs in a range; a slab rebuilt elsewhere no
//! longer counts, which the end of the run checks by killing r more nodes.
//!
//! The model: per page, the generations a read may return (0 = never written: zeros) and whether
//! a read may fail. Page bytes are a pattern of (page, generation) that names both in its first
//! 16 bytes, so a wrong read says what it returned. The checks:
//!
//! - within tolerance: every op succeeds and every read returns exactly the model's generation;
//!   pages torn by a client crash may read as old, new or an error (never a mix), until
//!   rewritten. After the workload the faults heal (stragglers end, the rest ran out) and only
//!   ticks run: every range must get back to no unavailable slab, no rebuild left, every
//!   reachable node connected; the engine's slab map must match the cluster's slabs (and, without
//!   a crash, no slab of ours may be leaked); every page must read back; then r more nodes are
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

use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem_client::core::Shape;
use remem_client::engine::EngineConfig;
use remem_placement::GroupChoice;

use crate::driver::{Completion, FaultTally, PlacementPolicy, SimDriver, SimOp};
use crate::schedule::{FaultAction, FaultSchedule};
use crate::{InFlightFate, NetworkOptions, SimCluster, SimTime, MILLISECOND, SECOND};

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

/// Whether a plan stays within what the code claims to survive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tolerance {
    /// At most r faulty nodes over the run: nothing may fail, nothing may be lost.
    Within,
    /// More than r: errors allowed, wrong data never.
    Beyond,
}

impl Tolerance {
    pub fn name(self) -> &'static str {
        match self {
            Tolerance::Within => "within",
            Tolerance::Beyond => "beyond",
        }
    }

    pub fn parse(text: &str) -> Option<Tolerance> {
        match text {
            "within" => Some(Tolerance::Within),
            "beyond" => Some(Tolerance::Beyond),
            _ => None,
        }
    }
}

/// A client crash in a plan: when (after the workload starts), how soon after a burst of writes,
/// what becomes of the messages in flight, and how long the client stays down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashPlan {
    pub at: SimTime,
    /// The crash comes 0..=this after a burst of writes is submitted.
    pub cut_after: SimTime,
    pub fate: InFlightFate,
    pub downtime: SimTime,
}

/// Everything a seed decides.
#[derive(Clone, Debug)]
pub struct ScenarioPlan {
    pub seed: u64,
    pub tolerance: Tolerance,
    pub node_count: usize,
    pub capacity_slabs: u32,
    /// (shape, pages) of each region, in page order.
    pub regions: Vec<(Shape, u64)>,
    pub placement: PlacementPolicy,
    /// Corruption counted after 16 splits instead of 256, and slabs rebuilt above 5%.
    pub low_corruption_threshold: bool,
    pub ops: usize,
    /// Ops arrive 0..=this apart.
    pub op_gap_max: SimTime,
    pub write_percent: u32,
    pub max_in_flight: usize,
    /// Fault times are relative to the start of the workload.
    pub schedule: FaultSchedule,
    pub crash: Option<CrashPlan>,
}

const fn shape(data_splits: usize, parity_splits: usize, extra_reads: usize) -> Shape {
    Shape { data_splits, parity_splits, extra_reads }
}

impl ScenarioPlan {
    /// The plan of `seed`: see the module documentation.
    pub fn generate(seed: u64, tolerance: Tolerance) -> ScenarioPlan {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5CE7_A210_0000_0001);
        let node_count = rng.gen_range(12..=14);
        let mut regions = vec![(shape(8, 2, 1), rng.gen_range(40..=64))];
        if rng.gen_ratio(1, 3) {
            regions.push((shape(1, 2, rng.gen_range(0..=1)), rng.gen_range(4..=12)));
        }
        if rng.gen_ratio(1, 3) {
            regions.push((shape(4, 2, rng.gen_range(0..=2)), rng.gen_range(12..=32)));
        }
        let placement = if regions.len() == 1 && rng.gen_bool(0.5) {
            let group_choice = match rng.gen_range(0..3) {
                0 => GroupChoice::Random,
                1 => GroupChoice::PowerOfTwo,
                _ => GroupChoice::LeastLoaded,
            };
            PlacementPolicy::CodingSets { load_balancing_factor: 2, group_choice }
        } else {
            PlacementPolicy::LeastLoaded
        };
        let ops = rng.gen_range(150..=300);
        let op_gap_max = 2 * MILLISECOND;
        let duration = ops as SimTime * op_gap_max / 2;
        let r = R;
        let schedule_seed = seed ^ 0xFA17_5EED_0000_0002;
        let schedule = match tolerance {
            Tolerance::Within => FaultSchedule::within_tolerance(schedule_seed, node_count, r, duration),
            Tolerance::Beyond => FaultSchedule::beyond_tolerance(schedule_seed, node_count, r, duration),
        };
        let crash_odds = match tolerance {
            Tolerance::Within => 5,
            Tolerance::Beyond => 10,
        };
        let crash = rng.gen_ratio(1, crash_odds).then(|| CrashPlan {
            at: rng.gen_range(duration / 4..=duration * 3 / 4),
            cut_after: 40 * crate::MICROSECOND,
            fate: match rng.gen_range(0..4) {
                0 => InFlightFate::Delivered,
                1 => InFlightFate::Dropped,
                _ => InFlightFate::Random { delivered_ppm: 500_000 },
            },
            downtime: rng.gen_range(0..=5 * MILLISECOND),
        });
        ScenarioPlan {
            seed,
            tolerance,
            node_count,
            capacity_slabs: 16,
            regions,
            placement,
            low_corruption_threshold: rng.gen_bool(0.5),
            ops,
            op_gap_max,
            write_percent: rng.gen_range(30..=70),
            max_in_flight: 8,
            schedule,
            crash,
        }
    }

    /// The engine settings of the plan: timeouts in milliseconds of simulated time, so stalls
    /// and partitions of a few milliseconds to a quarter of the run fall on both sides of the
    /// request timeout.
    pub fn engine_config(&self) -> EngineConfig {
        let mut config = EngineConfig::new(0x00C1_1E47_0000_0000 | (self.seed & 0xffff_ffff), PAGE_BYTES);
        config.max_in_flight = self.max_in_flight;
        config.request_timeout = std::time::Duration::from_millis(10);
        config.heartbeat_interval = std::time::Duration::from_millis(20);
        config.probe_interval = std::time::Duration::from_millis(20);
        if self.low_corruption_threshold {
            config.error_rate_min_samples = 16;
            config.error_correction_limit = 0.01;
            config.slab_regeneration_limit = 0.05;
        }
        config
    }
}

impl fmt::Display for ScenarioPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let regions: Vec<String> = self
            .regions
            .iter()
            .map(|(shape, pages)| {
                format!(
                    "EC({},{}) delta {} x {pages} pages",
                    shape.data_splits, shape.parity_splits, shape.extra_reads
                )
            })
            .collect();
        write!(
            f,
            "{} nodes, regions [{}], {:?}, {} ops ({}% writes), low corruption threshold: {}, crash: {:?}, \
             faulty nodes {:?}, faults {:?}",
            self.node_count,
            regions.join(", "),
            self.placement,
            self.ops,
            self.write_percent,
            self.low_corruption_threshold,
            self.crash,
            self.schedule.faulty_nodes,
            self.schedule.faults
        )
    }
}

/// What one scenario did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScenarioReport {
    pub reads_ok: u64,
    pub reads_failed: u64,
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub reads_decoded: u64,
    /// Pages read back at the end (after healing, and again with r more nodes down).
    pub pages_verified: u64,
    pub rebuilds_done: u64,
    pub faults: FaultTally,
    /// Nodes killed after healing to check that full redundancy is back.
    pub redundancy_kills: u64,
    /// Messages of a crashed client lost in flight (what tears its writes).
    pub torn_messages: u64,
    pub simulated_ns: SimTime,
}

impl ScenarioReport {
    pub fn add(&mut self, other: &ScenarioReport) {
        self.reads_ok += other.reads_ok;
        self.reads_failed += other.reads_failed;
        self.writes_ok += other.writes_ok;
        self.writes_failed += other.writes_failed;
        self.reads_decoded += other.reads_decoded;
        self.pages_verified += other.pages_verified;
        self.rebuilds_done += other.rebuilds_done;
        self.faults.add(&other.faults);
        self.redundancy_kills += other.redundancy_kills;
        self.torn_messages += other.torn_messages;
        self.simulated_ns += other.simulated_ns;
    }
}

/// A failed scenario: what went wrong, the plan, the replay command and (when traced) the trace.
#[derive(Clone, Debug)]
pub struct ScenarioFailure {
    pub seed: u64,
    pub tolerance: Tolerance,
    pub message: String,
    pub plan: String,
    pub trace: Vec<String>,
}

impl ScenarioFailure {
    /// The one-line command that runs just this seed, with its trace.
    pub fn replay_command(&self) -> String {
        replay_command(self.seed, self.tolerance)
    }
}

/// The one-line command that replays `seed`.
pub fn replay_command(seed: u64, tolerance: Tolerance) -> String {
    format!(
        "REMEM_SIM_SEED={seed} REMEM_SIM_TOLERANCE={} cargo nextest run -p remem-simnet --test scenarios \
         replay_seed_from_env --no-capture",
        tolerance.name()
    )
}

impl fmt::Display for ScenarioFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "scenario seed {} ({} tolerance) FAILED: {}",
            self.seed,
            self.tolerance.name(),
            self.message
        )?;
        writeln!(f, "  plan: {}", self.plan)?;
        writeln!(f, "  replay: {}", self.replay_command())?;
        for line in &self.trace {
            writeln!(f, "    {line}")?;
        }
        Ok(())
    }
}

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

/// Which written generations each 512-byte piece of `data` matches ('?' for none), to tell a mix
/// of generations from garbage.
fn describe_pieces(page: u64, data: &[u8], written: &[u64]) -> String {
    let patterns: Vec<(u64, Vec<u8>)> = written
        .iter()
        .map(|&generation| {
            let bytes = if generation == 0 { vec![0; PAGE_BYTES] } else { page_pattern(page, generation) };
            (generation, bytes)
        })
        .collect();
    data.chunks(512)
        .enumerate()
        .map(|(piece, chunk)| {
            let matches: Vec<String> = patterns
                .iter()
                .filter(|(_, bytes)| &bytes[piece * 512..piece * 512 + chunk.len()] == chunk)
                .map(|(generation, _)| generation.to_string())
                .collect();
            if matches.is_empty() {
                "?".to_owned()
            } else {
                matches.join("|")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The reference model of one page.
#[derive(Clone, Debug)]
struct PageModel {
    /// Generations a read may return now (0: zeros).
    acceptable: Vec<u64>,
    /// A read may fail (a failed or torn write) until the next successful write.
    may_fail: bool,
    /// Every generation ever submitted.
    written: Vec<u64>,
    next_generation: u64,
    /// Ops outstanding on the page.
    busy: u32,
}

impl PageModel {
    fn new() -> PageModel {
        PageModel { acceptable: vec![0], may_fail: false, written: vec![0], next_generation: 1, busy: 0 }
    }
}

/// An op the runner is waiting for.
#[derive(Clone, Copy, Debug)]
struct Pending {
    page: u64,
    /// The generation of a write.
    generation: Option<u64>,
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
                self.submit_write(page);
            } else {
                self.submit_read(page);
            }
        }
        Ok(())
    }

    fn submit_write(&mut self, page: u64) {
        let model = &mut self.pages[page as usize];
        let generation = model.next_generation;
        model.next_generation += 1;
        model.written.push(generation);
        model.busy += 1;
        let id = self.driver.submit(SimOp::Write { page, data: page_pattern(page, generation) });
        self.driver.note(|| format!("op {id}: write page {page} generation {generation}"));
        self.pending.insert(id, Pending { page, generation: Some(generation) });
    }

    fn submit_read(&mut self, page: u64) {
        self.pages[page as usize].busy += 1;
        let id = self.driver.submit(SimOp::Read { page });
        self.driver.note(|| format!("op {id}: read page {page}"));
        self.pending.insert(id, Pending { page, generation: None });
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

    fn check(&mut self, completion: Completion) -> Result<(), String> {
        let pending = self.pending.remove(&completion.id).expect("completions are of submitted ops");
        let id = completion.id;
        self.driver.note(|| format!("op {id} done: {:?}", completion.result.as_ref().map(|_| ())));
        let page = pending.page;
        let within = self.plan.tolerance == Tolerance::Within;
        let crashed = self.crashed;
        let model = &mut self.pages[page as usize];
        model.busy -= 1;
        let at = completion.completed_at;
        match (pending.generation, completion.result) {
            (Some(generation), Ok(())) => {
                self.report.writes_ok += 1;
                model.acceptable = vec![generation];
                model.may_fail = false;
            }
            (Some(generation), Err(error)) => {
                self.report.writes_failed += 1;
                if within {
                    return Err(format!(
                        "at {at} ns: write of page {page} generation {generation} failed within tolerance: {error}"
                    ));
                }
                if !model.acceptable.contains(&generation) {
                    model.acceptable.push(generation);
                }
                model.may_fail = true;
            }
            (None, Ok(())) => {
                self.report.reads_ok += 1;
                self.report.reads_decoded += u64::from(completion.decoded);
                let Some((returned_page, generation)) = identify(page, &completion.data) else {
                    return Err(format!(
                        "at {at} ns: read of page {page} returned bytes that are no generation of any page \
                         (a mix or garbage); the model allows generations {:?}; by 512-byte piece, the \
                         generations each piece matches: {}",
                        model.acceptable,
                        describe_pieces(page, &completion.data, &model.written)
                    ));
                };
                if returned_page != page {
                    return Err(format!(
                        "at {at} ns: read of page {page} returned page {returned_page} generation {generation}"
                    ));
                }
                let allowed = if !within && crashed { &model.written } else { &model.acceptable };
                if !allowed.contains(&generation) {
                    return Err(format!(
                        "at {at} ns: read of page {page} returned generation {generation}; the model allows {:?} \
                         (written: {:?})",
                        allowed, model.written
                    ));
                }
            }
            (None, Err(error)) => {
                self.report.reads_failed += 1;
                if within && !model.may_fail {
                    return Err(format!(
                        "at {at} ns: read of page {page} failed within tolerance: {error} (model: generation {:?})",
                        model.acceptable
                    ));
                }
            }
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
                self.submit_write(page);
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
                .filter(|&node| {
                    node_reachable(&self.driver, node) && !self.driver.engine().node(node).connected
                })
                .collect();
            return Err(format!(
                "not healed after {HEAL_LIMIT} ns of ticks: [{}], {:?}, reachable nodes not connected: {disconnected:?}",
                ranges.join("; "),
                self.driver.engine().regeneration_status()
            ));
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

    /// Reads every page once and checks it against the model.
    fn verify_every_page(&mut self) -> Result<(), String> {
        for page in 0..self.pages.len() as u64 {
            self.submit_read(page);
            self.report.pages_verified += 1;
            while self.driver.in_flight() >= self.plan.max_in_flight {
                let limit = self.driver.now() + DRAIN_LIMIT;
                if !self.driver.step(limit) {
                    return Err(format!("verification reads stuck for {DRAIN_LIMIT} ns"));
                }
                self.absorb()?;
            }
        }
        if !self.driver.run_until_idle(self.driver.now() + DRAIN_LIMIT) {
            return Err(format!("{} verification reads never completed", self.driver.in_flight()));
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
