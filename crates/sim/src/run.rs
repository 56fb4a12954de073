//! Scenarios, the experiments of seed 000 Figures 15 and 16, and running them.
//!
//! One job is one (scenario, policy): it places `layouts` independent layouts with seeds
//! derived from the job's content (so adding jobs changes no other job's numbers), measures
//! each layout's load balance, and runs failure trials round-robin over the layouts until
//! `target_losses` losing trials or `max_trials` trials.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::SeedableRng;
use remem_placement::PlacementError;
use serde::Serialize;

use crate::closed_form;
use crate::layout::Layout;
use crate::policy::Policy;

/// Copyset enumeration is skipped above this many (r+1)-subsets per layout.
const COPYSET_ENUMERATION_LIMIT: f64 = 3e6;
/// Trials per layout per round.
const TRIAL_BATCH: u64 = 2048;

/// One point of a sweep: the seed's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Scenario {
    /// N.
    pub nodes: usize,
    /// k.
    pub data_splits: usize,
    /// r.
    pub parity_splits: usize,
    /// l (CodingSets only).
    pub load_balancing_factor: usize,
    /// S: mean slabs per node; N*S/(k+r) ranges are placed.
    pub slabs_per_node: usize,
    /// f: the percentage of nodes failing at once.
    pub failed_percent: f64,
}

impl Scenario {
    /// The seed's base point (Figure 15): N=1000, k=8, r=2, l=2, S=16, f=1%.
    pub const BASE: Scenario = Scenario {
        nodes: 1000,
        data_splits: 8,
        parity_splits: 2,
        load_balancing_factor: 2,
        slabs_per_node: 16,
        failed_percent: 1.0,
    };

    pub fn width(&self) -> usize {
        self.data_splits + self.parity_splits
    }

    pub fn range_count(&self) -> usize {
        self.nodes * self.slabs_per_node / self.width()
    }

    /// F = N*f rounded to the nearest node.
    pub fn failed_nodes(&self) -> usize {
        ((self.nodes as f64 * self.failed_percent / 100.0).round() as usize).min(self.nodes)
    }

    /// The seed's closed form for `policy`: CodingSets counts G = N/(k+r+l) groups of k+r+l,
    /// every other policy G = N*S/(k+r) groups of k+r.
    pub fn closed_form(&self, policy: Policy) -> f64 {
        let (group_nodes, groups) = if policy.is_coding_sets() {
            let group_nodes = self.width() + self.load_balancing_factor;
            (group_nodes, self.nodes as f64 / group_nodes as f64)
        } else {
            (self.width(), (self.nodes * self.slabs_per_node) as f64 / self.width() as f64)
        };
        closed_form::loss_probability(
            self.nodes as u64,
            group_nodes as u64,
            groups,
            self.parity_splits as u64,
            self.failed_nodes() as u64,
        )
    }
}

/// One (experiment, scenario, policy) to run.
#[derive(Clone, Debug)]
pub struct Job {
    /// Which table or figure panel the row belongs to: "acceptance", "fig15-r", "fig16-nodes"...
    pub experiment: String,
    pub scenario: Scenario,
    pub policy: Policy,
    /// False for load-balance-only jobs.
    pub monte_carlo: bool,
}

/// How much work a job may do.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub layouts: usize,
    pub max_trials: u64,
    pub target_losses: u64,
    pub seed: u64,
}

impl Budget {
    /// Sized so that `remem sim` with no options ends within a minute on 2 cores.
    pub const QUICK: Budget = Budget { layouts: 8, max_trials: 200_000, target_losses: 2_000, seed: 1 };
    /// The acceptance table: 1% relative error at CodingSets' ~1% loss probability.
    pub const ACCEPTANCE: Budget =
        Budget { layouts: 8, max_trials: 2_000_000, target_losses: 10_000, seed: 1 };
    /// `--full`.
    pub const FULL: Budget = Budget { layouts: 16, max_trials: 10_000_000, target_losses: 20_000, seed: 1 };
}

/// One result row; also the CSV and JSON record.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub experiment: String,
    pub policy: Policy,
    #[serde(flatten)]
    pub scenario: Scenario,
    pub failed_nodes: usize,
    pub ranges: usize,
    /// The seed's closed form.
    pub loss_closed_form: f64,
    /// Distinct (r+1)-node copysets of the first layout (`None`: too many to enumerate).
    pub copysets: Option<u64>,
    /// The closed form's formula fed with `copysets` instead of the seed's count.
    pub loss_copysets_form: Option<f64>,
    /// Monte Carlo estimate over the layouts (`None` for load-only jobs).
    pub loss_monte_carlo: Option<f64>,
    pub loss_standard_error: Option<f64>,
    /// Upper end of a 95% interval; 3/trials when no trial lost data (rule of three).
    pub loss_upper_95: Option<f64>,
    pub trials: u64,
    pub losing_trials: u64,
    /// Max slabs on a node over mean slabs per node, averaged over layouts.
    pub load_max_over_mean: f64,
    /// Standard deviation over mean of slabs per node, averaged over layouts.
    pub load_coefficient_of_variation: f64,
    pub layouts: usize,
    pub seconds: f64,
}

/// A seed derived from the job's content.
fn job_seed(base: u64, job: &Job) -> u64 {
    let s = &job.scenario;
    let mut hash = splitmix(base);
    for value in [
        s.nodes as u64,
        s.data_splits as u64,
        s.parity_splits as u64,
        s.load_balancing_factor as u64,
        s.slabs_per_node as u64,
        s.failed_percent.to_bits(),
    ] {
        hash = splitmix(hash ^ value);
    }
    for byte in job.policy.name().bytes() {
        hash = splitmix(hash ^ u64::from(byte));
    }
    hash
}

pub(crate) fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs one job. Errors only if the policy cannot place (a bug for these unbounded nodes).
pub fn run_job(job: &Job, budget: &Budget) -> Result<Row, PlacementError> {
    let started = Instant::now();
    let scenario = job.scenario;
    assert!(budget.layouts > 0, "at least one layout");
    let seed = job_seed(budget.seed, job);
    let mut layouts = Vec::with_capacity(budget.layouts);
    for index in 0..budget.layouts as u64 {
        let mut policy = job.policy.build(splitmix(seed ^ (2 * index)), scenario.load_balancing_factor);
        layouts.push(Layout::place(
            policy.as_mut(),
            scenario.nodes,
            scenario.width(),
            scenario.range_count(),
        )?);
    }
    let balances: Vec<_> = layouts.iter().map(Layout::load_balance).collect();
    let load_max_over_mean = balances.iter().map(|b| b.max_over_mean).sum::<f64>() / balances.len() as f64;
    let load_coefficient_of_variation =
        balances.iter().map(|b| b.coefficient_of_variation).sum::<f64>() / balances.len() as f64;

    let copysets = layouts[0].copyset_count(scenario.parity_splits, COPYSET_ENUMERATION_LIMIT);
    let loss_copysets_form = copysets.map(|c| {
        closed_form::loss_probability_from_copysets(
            scenario.nodes as u64,
            c as f64,
            scenario.parity_splits as u64,
            scenario.failed_nodes() as u64,
        )
    });

    let mut per_layout_trials = vec![0u64; layouts.len()];
    let mut per_layout_losses = vec![0u64; layouts.len()];
    if job.monte_carlo {
        let mut rngs: Vec<StdRng> =
            (0..layouts.len() as u64).map(|i| StdRng::seed_from_u64(splitmix(seed ^ (2 * i + 1)))).collect();
        let mut scratches: Vec<_> = layouts.iter().map(Layout::scratch).collect();
        let batch = TRIAL_BATCH.min(budget.max_trials.div_ceil(layouts.len() as u64)).max(1);
        'rounds: loop {
            for (i, layout) in layouts.iter().enumerate() {
                let total: u64 = per_layout_trials.iter().sum();
                let losses: u64 = per_layout_losses.iter().sum();
                if total >= budget.max_trials || losses >= budget.target_losses {
                    break 'rounds;
                }
                per_layout_losses[i] += layout.monte_carlo(
                    scenario.failed_nodes(),
                    scenario.parity_splits,
                    batch,
                    &mut rngs[i],
                    &mut scratches[i],
                );
                per_layout_trials[i] += batch;
            }
        }
    }
    let trials: u64 = per_layout_trials.iter().sum();
    let losing_trials: u64 = per_layout_losses.iter().sum();
    let (loss_monte_carlo, loss_standard_error, loss_upper_95) = if job.monte_carlo {
        let (estimate, standard_error) = estimate(&per_layout_trials, &per_layout_losses);
        let upper = if losing_trials == 0 { 3.0 / trials as f64 } else { estimate + 1.96 * standard_error };
        (Some(estimate), Some(standard_error), Some(upper.min(1.0)))
    } else {
        (None, None, None)
    };
    Ok(Row {
        experiment: job.experiment.clone(),
        policy: job.policy,
        scenario,
        failed_nodes: scenario.failed_nodes(),
        ranges: scenario.range_count(),
        loss_closed_form: scenario.closed_form(job.policy),
        copysets,
        loss_copysets_form,
        loss_monte_carlo,
        loss_standard_error,
        loss_upper_95,
        trials,
        losing_trials,
        load_max_over_mean,
        load_coefficient_of_variation,
        layouts: layouts.len(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The pooled estimate and its standard error. Layouts are random draws too, so the error is
/// the spread of the per-layout estimates over sqrt(layouts) (it holds both the layout and the
/// trial variance); the binomial error of the pooled trials is its floor, since a few layouts
/// can look alike by chance.
pub fn estimate(trials: &[u64], losses: &[u64]) -> (f64, f64) {
    let total: u64 = trials.iter().sum();
    if total == 0 {
        return (0.0, 0.0);
    }
    let pooled = losses.iter().sum::<u64>() as f64 / total as f64;
    let binomial = (pooled * (1.0 - pooled) / total as f64).sqrt();
    let per_layout: Vec<f64> =
        trials.iter().zip(losses).filter(|(&t, _)| t > 0).map(|(&t, &l)| l as f64 / t as f64).collect();
    if per_layout.len() < 2 {
        return (pooled, binomial);
    }
    let mean = per_layout.iter().sum::<f64>() / per_layout.len() as f64;
    let variance = per_layout.iter().map(|p| (p - mean).powi(2)).sum::<f64>() / (per_layout.len() - 1) as f64;
    (pooled, binomial.max((variance / per_layout.len() as f64).sqrt()))
}

/// Runs `jobs` on `threads` threads (one job per thread at a time), calling `progress` after
/// each with (done, total, row). Rows come back in job order.
pub fn run_jobs(
    jobs: &[(Job, Budget)],
    threads: usize,
    progress: &(dyn Fn(usize, usize, &Row) + Sync),
) -> Result<Vec<Row>, PlacementError> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Row, PlacementError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some((job, budget)) = jobs.get(index) else { break };
                let result = run_job(job, budget);
                let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                if let Ok(row) = &result {
                    progress(finished, jobs.len(), row);
                }
                results.lock().expect("no thread panics holding the lock")[index] = Some(result);
            });
        }
    });
    results
        .into_inner()
        .expect("no thread panics holding the lock")
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

/// The acceptance table: the base point for every policy.
pub fn acceptance_jobs() -> Vec<Job> {
    Policy::ALL
        .into_iter()
        .map(|policy| Job {
            experiment: "acceptance".into(),
            scenario: Scenario::BASE,
            policy,
            monte_carlo: true,
        })
        .collect()
}

/// Policies drawn in Figure 15: the seed's three schemes and the power-of-two group choice.
const FIGURE_15_POLICIES: [Policy; 4] =
    [Policy::EcCache, Policy::PowerOfTwoPerSlab, Policy::CodingSets, Policy::CodingSetsPowerOfTwo];

/// Figure 15: loss probability at N=1000 around the base point, one panel per parameter
/// (r, l, S, f), reconstructed from the seed's caption and text.
pub fn figure15_jobs(full: bool) -> Vec<Job> {
    let base = Scenario::BASE;
    let parity: &[usize] = if full { &[1, 2, 3, 4] } else { &[1, 2, 3] };
    let extra: &[usize] = if full { &[0, 1, 2, 3, 4, 6, 8] } else { &[0, 2, 4] };
    let slabs: &[usize] = if full { &[1, 2, 4, 8, 16, 32, 64, 100] } else { &[4, 16, 64] };
    let failed: &[f64] = if full { &[0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0] } else { &[0.5, 1.0, 2.0] };
    let mut scenarios: Vec<(&str, Scenario)> = Vec::new();
    scenarios.extend(parity.iter().map(|&r| ("fig15-r", Scenario { parity_splits: r, ..base })));
    scenarios.extend(extra.iter().map(|&l| ("fig15-l", Scenario { load_balancing_factor: l, ..base })));
    scenarios.extend(slabs.iter().map(|&s| ("fig15-S", Scenario { slabs_per_node: s, ..base })));
    scenarios.extend(failed.iter().map(|&f| ("fig15-f", Scenario { failed_percent: f, ..base })));
    let mut jobs = Vec::new();
    for (experiment, scenario) in scenarios {
        for policy in FIGURE_15_POLICIES {
            jobs.push(Job { experiment: experiment.into(), scenario, policy, monte_carlo: true });
        }
    }
    jobs
}

/// Figure 16: load balance (k=8, r=2, S=16) against the cluster size for EC-Cache, per-slab
/// power of two and CodingSets with l = 0, 2, 4 (and the power-of-two group choice at l=2),
/// and against l at N=1000 for every policy.
pub fn figure16_jobs(full: bool) -> Vec<Job> {
    let base = Scenario::BASE;
    let sizes: &[usize] =
        if full { &[100, 1_000, 10_000, 100_000, 1_000_000] } else { &[100, 1_000, 10_000] };
    let extras: &[usize] = if full { &[0, 1, 2, 3, 4, 6, 8] } else { &[0, 2, 4] };
    let mut jobs = Vec::new();
    for &nodes in sizes {
        let mut lines: Vec<(Policy, usize)> = vec![(Policy::EcCache, 2), (Policy::PowerOfTwoPerSlab, 2)];
        lines.extend([0, 2, 4].map(|l| (Policy::CodingSets, l)));
        lines.push((Policy::CodingSetsPowerOfTwo, 2));
        for (policy, l) in lines {
            let scenario = Scenario { nodes, load_balancing_factor: l, ..base };
            jobs.push(Job { experiment: "fig16-nodes".into(), scenario, policy, monte_carlo: false });
        }
    }
    for &l in extras {
        for policy in Policy::ALL {
            let scenario = Scenario { load_balancing_factor: l, ..base };
            jobs.push(Job { experiment: "fig16-l".into(), scenario, policy, monte_carlo: false });
        }
    }
    jobs
}

/// Every combination of the given values, for every policy in `policies`.
pub fn sweep_jobs(
    nodes: &[usize],
    data_splits: &[usize],
    parity_splits: &[usize],
    load_balancing_factors: &[usize],
    slabs_per_node: &[usize],
    failed_percents: &[f64],
    policies: &[Policy],
) -> Vec<Job> {
    let mut jobs = Vec::new();
    for &n in nodes {
        for &k in data_splits {
            for &r in parity_splits {
                for &l in load_balancing_factors {
                    for &s in slabs_per_node {
                        for &f in failed_percents {
                            for &policy in policies {
                                let scenario = Scenario {
                                    nodes: n,
                                    data_splits: k,
                                    parity_splits: r,
                                    load_balancing_factor: l,
                                    slabs_per_node: s,
                                    failed_percent: f,
                                };
                                jobs.push(Job {
                                    experiment: "sweep".into(),
                                    scenario,
                                    policy,
                                    monte_carlo: true,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_scenario_has_the_seed_numbers() {
        let s = Scenario::BASE;
        assert_eq!(s.range_count(), 1600);
        assert_eq!(s.failed_nodes(), 10);
        assert!(s.closed_form(Policy::EcCache) > 0.12 && s.closed_form(Policy::EcCache) < 0.14);
        assert!(s.closed_form(Policy::CodingSets) > 0.012 && s.closed_form(Policy::CodingSets) < 0.014);
        assert_eq!(s.closed_form(Policy::PowerOfTwoPerSlab), s.closed_form(Policy::EcCache));
    }

    #[test]
    fn estimate_floors_at_the_binomial_error() {
        let (p, se) = estimate(&[1000, 1000], &[10, 10]);
        assert!((p - 0.01).abs() < 1e-12);
        assert!((se - (0.01f64 * 0.99 / 2000.0).sqrt()).abs() < 1e-12);
        let (_, spread) = estimate(&[1000, 1000], &[0, 40]);
        assert!(spread > 0.019, "{spread}");
    }

    #[test]
    fn small_job_is_deterministic_and_reports_everything() {
        let job = Job {
            experiment: "test".into(),
            scenario: Scenario { nodes: 60, slabs_per_node: 4, failed_percent: 10.0, ..Scenario::BASE },
            policy: Policy::CodingSets,
            monte_carlo: true,
        };
        let budget = Budget { layouts: 2, max_trials: 4096, target_losses: u64::MAX, seed: 3 };
        let first = run_job(&job, &budget).unwrap();
        let second = run_job(&job, &budget).unwrap();
        assert_eq!(first.losing_trials, second.losing_trials);
        assert_eq!(first.trials, 4096);
        assert_eq!(first.ranges, 24);
        assert!(first.copysets.is_some() && first.loss_monte_carlo.is_some());
        assert!(first.load_max_over_mean >= 1.0);
    }

    #[test]
    fn run_jobs_keeps_job_order_on_two_threads() {
        let budget = Budget { layouts: 1, max_trials: 512, target_losses: u64::MAX, seed: 1 };
        let jobs: Vec<(Job, Budget)> = Policy::ALL
            .into_iter()
            .map(|policy| {
                let scenario = Scenario { nodes: 40, slabs_per_node: 5, ..Scenario::BASE };
                (Job { experiment: "t".into(), scenario, policy, monte_carlo: true }, budget)
            })
            .collect();
        let rows = run_jobs(&jobs, 2, &|_, _, _| {}).unwrap();
        let names: Vec<_> = rows.iter().map(|r| r.policy).collect();
        assert_eq!(names, Policy::ALL.to_vec());
    }
}
