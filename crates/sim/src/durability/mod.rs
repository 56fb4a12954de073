//! Durability over time (`remem sim durability`): how much data a cluster loses per year when
//! nodes and racks fail at measured rates and every lost slab is rebuilt at the measured
//! rebuild speed, where the placement policy says.
//!
//! Model (docs/PLACEMENT.md, "Durability over time"): N nodes in racks of `rack_size`
//! consecutive nodes. Each node fails permanently (memory lost; the machine is replaced, empty,
//! after `replace_hours`), or transiently (unreachable for a while, memory intact); each rack
//! fails as a whole (every node's memory lost). Lifetimes are exponential, or Weibull with the
//! same mean. A down slab is declared lost after the lease timeout (`detect_seconds`) and
//! rebuilt on the node `Placement::replace` names, in one of that node's `rebuild_parallel`
//! lanes, taking slab size / rebuild speed. A transient node that returns before a slab's
//! rebuild is done brings the slab back. A range is lost when more than r of its k+r slabs are
//! down at once; it is counted once, then treated as rewritten (its slabs keep being rebuilt).
//!
//! Trials are independent and seeded; a (scheme, policy) row's figures are means over trials
//! with a 95% interval from their spread, beside the observed loss count's Poisson interval.

mod exposure;
mod trial;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use remem_placement::PlacementError;
use serde::Serialize;

use crate::policy::Policy;

pub use trial::Trial;

pub const SECONDS_PER_YEAR: f64 = 365.25 * 24.0 * 3600.0;

/// The cluster, its failures and its rebuilds.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    pub nodes: usize,
    /// l, for CodingSets.
    pub load_balancing_factor: usize,
    /// Slabs per node; every scheme stores N*S/(k+r) ranges (equal memory).
    pub slabs_per_node: usize,
    /// Consecutive nodes per rack (failure domain); 1: every node its own.
    pub rack_size: usize,
    /// Whether placement sees the racks (each node's failure domain is its rack) or not (every
    /// node is its own domain, so a range may put many slabs in one rack).
    pub domain_aware: bool,
    pub node_mttf_years: f64,
    pub rack_mttf_years: f64,
    /// Mean time between transient failures of one node; 0: none.
    pub transient_mttf_years: f64,
    /// Mean length of a transient failure (exponential).
    pub transient_mean_seconds: f64,
    /// Weibull shape of node and rack lifetimes (same mean); `None`: exponential.
    pub weibull_shape: Option<f64>,
    /// Time from a node going down to its slabs being declared lost (the lease timeout).
    pub detect_seconds: f64,
    pub slab_bytes: u64,
    pub rebuild_mib_per_second: f64,
    /// Rebuilds one node runs at once.
    pub rebuild_parallel: usize,
    /// Time to replace a dead machine (it comes back empty).
    pub replace_hours: f64,
}

impl Config {
    pub fn rack_count(&self) -> usize {
        self.nodes.div_ceil(self.rack_size.max(1))
    }

    pub fn rack_of(&self, node: usize) -> u32 {
        (node / self.rack_size.max(1)) as u32
    }

    /// The failure domain placement sees: the rack, or nothing (a domain of its own).
    pub fn domain_label(&self, node: usize) -> String {
        if self.domain_aware && self.rack_size > 1 {
            format!("rack{}", self.rack_of(node))
        } else {
            String::new()
        }
    }

    pub fn rebuild_seconds(&self) -> f64 {
        self.slab_bytes as f64 / (self.rebuild_mib_per_second * 1024.0 * 1024.0)
    }

    fn rates(&self) -> exposure::Rates {
        let per_second =
            |mttf_years: f64| if mttf_years > 0.0 { 1.0 / (mttf_years * SECONDS_PER_YEAR) } else { 0.0 };
        exposure::Rates {
            node_per_second: per_second(self.node_mttf_years) + per_second(self.transient_mttf_years),
            rack_per_second: per_second(self.rack_mttf_years),
        }
    }
}

/// What one trial saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TrialResult {
    pub years: f64,
    pub ranges: u64,
    /// Failure instants (a node, a rack) that lost at least one range.
    pub loss_events: u64,
    pub ranges_lost: u64,
    /// Expected ranges lost: first order where exact, second order ahead of it (see `exposure`).
    pub expected_ranges_lost: f64,
    /// The first-order estimate alone (exact in expectation with exponential lifetimes).
    pub expected_first_order: f64,
    pub node_failures: u64,
    pub rack_failures: u64,
    pub transient_failures: u64,
    pub rebuilds: u64,
    pub rebuild_retries: u64,
    pub slabs_returned: u64,
    pub down_windows: u64,
    pub down_seconds_total: f64,
    pub down_seconds_max: f64,
    pub rebuild_wait_seconds_max: f64,
    /// Most machines dead (awaiting replacement) at once: the spare capacity rebuilds needed.
    pub peak_dead_nodes: u64,
}

/// A code: k data and r parity splits (rep(n) is k=1, r=n-1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Scheme {
    pub data_splits: usize,
    pub parity_splits: usize,
}

impl Scheme {
    pub fn name(&self) -> String {
        if self.data_splits == 1 {
            format!("rep({})", self.parity_splits + 1)
        } else {
            format!("EC({},{})", self.data_splits, self.parity_splits)
        }
    }
}

/// One (scheme, policy) of a durability run.
#[derive(Clone, Copy, Debug)]
pub struct DurabilityJob {
    pub scheme: Scheme,
    pub policy: Policy,
}

/// Figures of one (scheme, policy) over its trials.
#[derive(Clone, Debug, Serialize)]
pub struct DurabilityRow {
    pub scheme: String,
    pub policy: Policy,
    pub data_splits: usize,
    pub parity_splits: usize,
    pub domain_aware: bool,
    pub trials: usize,
    pub years_simulated: f64,
    pub ranges: u64,
    pub stored_bytes: u64,
    pub loss_events: u64,
    pub loss_events_per_year: f64,
    /// Poisson 95% interval of the observed loss event count, per year.
    pub loss_events_per_year_low: f64,
    pub loss_events_per_year_high: f64,
    pub ranges_lost: u64,
    /// Expected ranges lost per year (mean over trials) and its 95% interval.
    pub expected_ranges_lost_per_year: f64,
    pub expected_ranges_lost_per_year_low: f64,
    pub expected_ranges_lost_per_year_high: f64,
    pub expected_first_order_per_year: f64,
    /// Expected bytes lost per year (k slabs per lost range).
    pub bytes_lost_per_year: f64,
    /// -log10 of the expected fraction of stored bytes lost per year, and its 95% interval.
    pub nines: f64,
    pub nines_low: f64,
    pub nines_high: f64,
    pub node_failures_per_year: f64,
    pub rack_failures_per_year: f64,
    pub transient_failures_per_year: f64,
    pub rebuilds_per_year: f64,
    pub mean_down_seconds: f64,
    pub max_down_seconds: f64,
    pub max_rebuild_wait_seconds: f64,
    pub peak_dead_nodes: u64,
    pub seconds: f64,
}

/// Γ(x) for x > 0 (Lanczos, g = 7), for the Weibull scale with a given mean.
pub fn gamma(x: f64) -> f64 {
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    assert!(x > 0.0, "gamma of a positive number");
    if x < 0.5 {
        return std::f64::consts::PI / ((std::f64::consts::PI * x).sin() * gamma(1.0 - x));
    }
    let x = x - 1.0;
    let mut sum = COEFFICIENTS[0];
    for (i, &c) in COEFFICIENTS.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + 7.5;
    (2.0 * std::f64::consts::PI).sqrt() * t.powf(x + 0.5) * (-t).exp() * sum
}

/// P(X <= count) for X ~ Poisson(mean).
fn poisson_cdf(count: u64, mean: f64) -> f64 {
    let mut term = (-mean).exp();
    let mut total = term;
    for i in 1..=count {
        term *= mean / i as f64;
        total += term;
    }
    total
}

/// The exact (Garwood) 95% interval of a Poisson mean given `count` events.
pub fn poisson_interval_95(count: u64) -> (f64, f64) {
    if count > 200 {
        let (n, half) = (count as f64, 1.96 * (count as f64).sqrt());
        return ((n - half).max(0.0), n + half);
    }
    // Bisection on the mean: P(X >= count) = 0.025 for the low end, P(X <= count) = 0.025 high.
    let solve = |target: &dyn Fn(f64) -> f64| {
        let (mut low, mut high) = (0.0, 10.0 + 5.0 * count as f64);
        for _ in 0..100 {
            let mid = (low + high) / 2.0;
            if target(mid) > 0.0 {
                low = mid;
            } else {
                high = mid;
            }
        }
        (low + high) / 2.0
    };
    let low = if count == 0 { 0.0 } else { solve(&|mean| 0.025 - (1.0 - poisson_cdf(count - 1, mean))) };
    let high = solve(&|mean| poisson_cdf(count, mean) - 0.025);
    (low, high)
}

/// Mean and 95% half-width of per-trial values.
fn mean_interval(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, f64::INFINITY);
    }
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, 1.96 * (variance / n).sqrt())
}

fn nines(fraction: f64) -> f64 {
    if fraction > 0.0 {
        -fraction.log10()
    } else {
        f64::INFINITY
    }
}

/// Combines a row's trials.
pub fn summarize(
    job: &DurabilityJob,
    config: &Config,
    trials: &[TrialResult],
    seconds: f64,
) -> DurabilityRow {
    let years: f64 = trials.iter().map(|t| t.years).sum();
    let sum = |f: &dyn Fn(&TrialResult) -> f64| trials.iter().map(f).sum::<f64>();
    let ranges = trials.first().map_or(0, |t| t.ranges);
    let loss_events: u64 = trials.iter().map(|t| t.loss_events).sum();
    let (events_low, events_high) = poisson_interval_95(loss_events);
    let per_trial: Vec<f64> = trials.iter().map(|t| t.expected_ranges_lost / t.years).collect();
    let (expected, half_width) = mean_interval(&per_trial);
    let (low, high) = ((expected - half_width).max(0.0), expected + half_width);
    let fraction = |ranges_per_year: f64| ranges_per_year / ranges as f64;
    let data_bytes = job.scheme.data_splits as f64 * config.slab_bytes as f64;
    let windows = sum(&|t| t.down_windows as f64);
    DurabilityRow {
        scheme: job.scheme.name(),
        policy: job.policy,
        data_splits: job.scheme.data_splits,
        parity_splits: job.scheme.parity_splits,
        domain_aware: config.domain_aware,
        trials: trials.len(),
        years_simulated: years,
        ranges,
        stored_bytes: ranges * job.scheme.data_splits as u64 * config.slab_bytes,
        loss_events,
        loss_events_per_year: loss_events as f64 / years,
        loss_events_per_year_low: events_low / years,
        loss_events_per_year_high: events_high / years,
        ranges_lost: trials.iter().map(|t| t.ranges_lost).sum(),
        expected_ranges_lost_per_year: expected,
        expected_ranges_lost_per_year_low: low,
        expected_ranges_lost_per_year_high: high,
        expected_first_order_per_year: sum(&|t| t.expected_first_order) / years,
        bytes_lost_per_year: expected * data_bytes,
        nines: nines(fraction(expected)),
        nines_low: nines(fraction(high)),
        nines_high: nines(fraction(low)),
        node_failures_per_year: sum(&|t| t.node_failures as f64) / years,
        rack_failures_per_year: sum(&|t| t.rack_failures as f64) / years,
        transient_failures_per_year: sum(&|t| t.transient_failures as f64) / years,
        rebuilds_per_year: sum(&|t| t.rebuilds as f64) / years,
        mean_down_seconds: if windows > 0.0 { sum(&|t| t.down_seconds_total) / windows } else { 0.0 },
        max_down_seconds: trials.iter().map(|t| t.down_seconds_max).fold(0.0, f64::max),
        max_rebuild_wait_seconds: trials.iter().map(|t| t.rebuild_wait_seconds_max).fold(0.0, f64::max),
        peak_dead_nodes: trials.iter().map(|t| t.peak_dead_nodes).max().unwrap_or(0),
        seconds,
    }
}

/// A seed per (job, trial), from the base seed and the job's content.
fn trial_seed(base: u64, job: &DurabilityJob, trial: usize) -> u64 {
    let mut hash = crate::run::splitmix(base);
    for value in [job.scheme.data_splits as u64, job.scheme.parity_splits as u64, trial as u64] {
        hash = crate::run::splitmix(hash ^ value);
    }
    for byte in job.policy.name().bytes() {
        hash = crate::run::splitmix(hash ^ u64::from(byte));
    }
    hash
}

/// Progress of a run: (trials done, trials in all, the row's name, simulated years of the trial
/// that reported), called from worker threads.
pub type Progress<'a> = dyn Fn(usize, usize, &str, f64) + Sync + 'a;

/// Runs `trials` trials of `years` for every job on `threads` threads; rows in job order.
pub fn run_durability(
    config: &Config,
    jobs: &[DurabilityJob],
    trials: usize,
    years: f64,
    seed: u64,
    threads: usize,
    progress: &Progress<'_>,
) -> Result<Vec<DurabilityRow>, PlacementError> {
    assert!(trials > 0 && years > 0.0, "at least one trial of some time");
    let tasks: Vec<(usize, usize)> = (0..jobs.len()).flat_map(|j| (0..trials).map(move |t| (j, t))).collect();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let started = Instant::now();
    let results: Mutex<Vec<Vec<Option<TrialResult>>>> = Mutex::new(vec![vec![None; trials]; jobs.len()]);
    let error: Mutex<Option<PlacementError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(job_index, trial_index)) = tasks.get(index) else { break };
                let job = &jobs[job_index];
                let name = format!("{} {} trial {}", job.scheme.name(), job.policy.name(), trial_index + 1);
                let seed = trial_seed(seed, job, trial_index);
                let trial = match Trial::new(
                    config,
                    job.policy,
                    job.scheme.data_splits,
                    job.scheme.parity_splits,
                    seed,
                ) {
                    Ok(trial) => trial,
                    Err(e) => {
                        *error.lock().expect("no panics under the lock") = Some(e);
                        break;
                    }
                };
                let finished = || done.load(Ordering::Relaxed);
                let result = trial.run(years, &mut |at| progress(finished(), tasks.len(), &name, at));
                results.lock().expect("no panics under the lock")[job_index][trial_index] = Some(result);
                let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                progress(finished, tasks.len(), &name, years);
            });
        }
    });
    if let Some(e) = error.into_inner().expect("no panics under the lock") {
        return Err(e);
    }
    let seconds = started.elapsed().as_secs_f64();
    let results = results.into_inner().expect("no panics under the lock");
    Ok(jobs
        .iter()
        .zip(results)
        .map(|(job, trials)| {
            let trials: Vec<TrialResult> = trials.into_iter().map(|t| t.expect("every trial ran")).collect();
            summarize(job, config, &trials, seconds)
        })
        .collect())
}

#[cfg(test)]
mod tests;

/// Writes durability rows as an aligned table: per row, loss events per year (observed, with
/// their Poisson interval), expected ranges and bytes lost per year, and the nines of
/// durability (-log10 of the fraction of stored bytes lost per year) with their interval.
pub fn write_durability_table(rows: &[DurabilityRow], out: &mut dyn std::io::Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<8} {:<17} {:>6} {:>7} | {:>6} {:>19} | {:>21} {:>10} | {:>17} | {:>8} {:>8} {:>5}",
        "scheme",
        "policy",
        "ranges",
        "years",
        "losses",
        "events/yr (95%)",
        "ranges lost/yr (95%)",
        "bytes/yr",
        "nines (95%)",
        "down s",
        "max s",
        "spare"
    )?;
    for row in rows {
        let nines = |v: f64| if v.is_finite() { format!("{v:.1}") } else { "inf".into() };
        writeln!(
            out,
            "{:<8} {:<17} {:>6} {:>7.0} | {:>6} {:>19} | {:>21} {:>10} | {:>17} | {:>8.1} {:>8.0} {:>5}",
            row.scheme,
            row.policy.name(),
            row.ranges,
            row.years_simulated,
            row.loss_events,
            format!(
                "{:.1e} [{:.0e},{:.0e}]",
                row.loss_events_per_year, row.loss_events_per_year_low, row.loss_events_per_year_high
            ),
            format!(
                "{:.1e} [{:.0e},{:.0e}]",
                row.expected_ranges_lost_per_year,
                row.expected_ranges_lost_per_year_low,
                row.expected_ranges_lost_per_year_high
            ),
            format_bytes(row.bytes_lost_per_year),
            format!("{} [{}, {}]", nines(row.nines), nines(row.nines_low), nines(row.nines_high)),
            row.mean_down_seconds,
            row.max_down_seconds,
            row.peak_dead_nodes,
        )?;
    }
    Ok(())
}

fn format_bytes(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if bytes == 0.0 {
        "0".into()
    } else if bytes < 1.0 {
        format!("{bytes:.1e}B")
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}
