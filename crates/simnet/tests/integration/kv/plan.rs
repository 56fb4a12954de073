//! What a kv run is before it runs (a plan drawn from a seed: scheme, faults within the
//! scheme's tolerance or beyond, workload size) and what it reports after: counts, or the
//! failure with the command that replays it.

use std::collections::BTreeMap;
use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem_kv::{EcShape, Scheme};
use remem_simnet::{FaultSchedule, FaultTally, SimTime, Tolerance, MILLISECOND};

/// The EC shape of every run's cache.
pub const EC: EcShape = EcShape { data_splits: 4, parity_splits: 2 };
/// Nodes of every run's cluster.
pub const NODES: usize = 8;

/// The scheme of a run: one fixed scheme, or `auto` (the policy by size and hotness).
pub fn scheme_name(scheme: Option<Scheme>) -> String {
    scheme.map_or("auto".into(), |scheme| scheme.label(EC))
}

/// Node failures every value of the run survives.
pub fn tolerance_of(scheme: Option<Scheme>) -> usize {
    match scheme {
        Some(scheme) => scheme.tolerates(EC),
        // auto: small values rep2, large EOR, cold ones EC: one failure.
        None => 1,
    }
}

/// Everything a seed decides.
#[derive(Clone, Debug)]
pub struct KvPlan {
    pub seed: u64,
    pub scheme: Option<Scheme>,
    pub tolerance: Tolerance,
    pub ops: usize,
    pub op_gap_max: SimTime,
    pub schedule: FaultSchedule,
}

impl KvPlan {
    /// A plan for `scheme` (`None`: auto). `none` gets no faults: it claims to survive none.
    pub fn generate(seed: u64, scheme: Option<Scheme>, tolerance: Tolerance) -> KvPlan {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6B76_5349_4D00_0001);
        let ops = rng.gen_range(150..=300);
        let op_gap_max = rng.gen_range(2..=12) * MILLISECOND;
        let duration = ops as SimTime * op_gap_max / 2;
        let r = tolerance_of(scheme);
        let schedule = match (r, tolerance) {
            (0, Tolerance::Within) => FaultSchedule::default(),
            (_, Tolerance::Within) => FaultSchedule::within_tolerance(seed, NODES, r, duration),
            (_, Tolerance::Beyond) => FaultSchedule::beyond_tolerance(seed, NODES, r, duration),
        };
        KvPlan { seed, scheme, tolerance, ops, op_gap_max, schedule }
    }

    /// The command that runs just this plan again, with its trace.
    pub fn replay_command(&self) -> String {
        format!(
            "REMEM_KV_SEED={} REMEM_KV_SCHEME={} REMEM_KV_TOLERANCE={} cargo nextest run -p remem-simnet \
             --test integration kv::replay_seed_from_env --no-capture",
            self.seed,
            scheme_name(self.scheme),
            self.tolerance.name()
        )
    }
}

impl fmt::Display for KvPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "kv seed {} scheme {} {} r: {} ops {} ms apart at most",
            self.seed,
            scheme_name(self.scheme),
            self.tolerance.name(),
            self.ops,
            self.op_gap_max / MILLISECOND
        )?;
        for fault in &self.schedule.faults {
            writeln!(f, "  at {:.3} ms node {}: {:?}", fault.at as f64 / 1e6, fault.node, fault.action)?;
        }
        Ok(())
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct KvReport {
    pub requests: u64,
    pub values_read: u64,
    pub misses: u64,
    pub store_errors: u64,
    pub read_errors: u64,
    pub evictions: u64,
    pub transitions: u64,
    /// Page bytes the cache read from remote memory, reads that decoded around a missing
    /// split, and values it found lost (`stats`).
    pub remote_read_bytes: u64,
    pub degraded_reads: u64,
    pub lost_reads: u64,
    pub ranges_mapped: u64,
    pub ranges_released: u64,
    pub faults: FaultTally,
    pub simulated_ns: SimTime,
    /// Store errors by the start of their text (what made them: a write that failed, a region
    /// that could not grow).
    pub store_error_kinds: BTreeMap<String, u64>,
}

impl KvReport {
    pub fn add(&mut self, other: &KvReport) {
        self.requests += other.requests;
        self.values_read += other.values_read;
        self.misses += other.misses;
        self.store_errors += other.store_errors;
        self.read_errors += other.read_errors;
        self.evictions += other.evictions;
        self.transitions += other.transitions;
        self.remote_read_bytes += other.remote_read_bytes;
        self.degraded_reads += other.degraded_reads;
        self.lost_reads += other.lost_reads;
        self.ranges_mapped += other.ranges_mapped;
        self.ranges_released += other.ranges_released;
        self.faults.add(&other.faults);
        self.simulated_ns += other.simulated_ns;
        for (kind, count) in &other.store_error_kinds {
            *self.store_error_kinds.entry(kind.clone()).or_default() += count;
        }
    }
}

/// A failed run: the seed, what broke, and how to replay it.
#[derive(Debug)]
pub struct KvFailure {
    pub plan: KvPlan,
    pub message: String,
    pub trace: Vec<String>,
}

impl fmt::Display for KvFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.plan)?;
        writeln!(f, "FAILED: {}", self.message)?;
        writeln!(f, "trace (last lines):")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        writeln!(f, "replay: {}", self.plan.replay_command())
    }
}
