//! What a scenario is before it runs (a plan drawn from a seed, within r faults or beyond) and
//! what it reports after: counts, or the failure with the command that replays it.

use super::*;
use crate::driver::{FaultTally, PlacementPolicy};
use crate::schedule::FaultSchedule;
use crate::{InFlightFate, SimTime, MILLISECOND};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem_client::core::Shape;
use remem_client::engine::EngineConfig;
use remem_placement::GroupChoice;
use std::fmt;

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
    /// EC-oriented replication in the workload: some writes are data-only, and parity-stale
    /// pages get their parity writes (drawn apart from the rest, so that a plan without it is
    /// the plan the seed gave before it existed).
    pub eor: bool,
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
            eor: StdRng::seed_from_u64(seed ^ 0xE0E0_2A11_0000_0005).gen_bool(0.5),
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
            "{} nodes, regions [{}], {:?}, {} ops ({}% writes{}), low corruption threshold: {}, crash: {:?}, \
             faulty nodes {:?}, faults {:?}",
            self.node_count,
            regions.join(", "),
            self.placement,
            self.ops,
            self.write_percent,
            if self.eor { ", some data-only and parity writes" } else { "" },
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
    /// Whole writes.
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub write_data_ok: u64,
    pub write_data_failed: u64,
    pub write_parity_ok: u64,
    pub write_parity_failed: u64,
    /// Reads of parity-stale pages that failed (allowed: a data split may be lost).
    pub parity_stale_reads_failed: u64,
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
        self.write_data_ok += other.write_data_ok;
        self.write_data_failed += other.write_data_failed;
        self.write_parity_ok += other.write_parity_ok;
        self.write_parity_failed += other.write_parity_failed;
        self.parity_stale_reads_failed += other.parity_stale_reads_failed;
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
        "REMEM_SIM_SEED={seed} REMEM_SIM_TOLERANCE={} cargo nextest run -p remem-simnet --test integration \
         scenarios::replay_seed_from_env --no-capture",
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
