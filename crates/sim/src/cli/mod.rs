//! `remem sim`: the availability and load-balance simulator (this crate) from the command
//! line: argument parsing, progress on stderr, the table, CSV, JSON and the PNG figures.
//!
//! With no sweep option it runs the acceptance table (the seed's base point for every policy)
//! and the experiments of seed 000 Figures 15 and 16; with any of --nodes, -k, -r, -l,
//! --slabs-per-node, --failed-percent it runs their cartesian product instead.
//! `remem sim durability` (module `durability`) simulates failures and rebuilds over years;
//! `plot` draws the figures. Compiled with the crate's `cli` feature only (the cli's), so the
//! simulator itself depends on no argument parser and no plotting library.

pub mod durability;
mod plot;

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::run::{acceptance_jobs, figure15_jobs, figure16_jobs, sweep_jobs};
use crate::{run_jobs, Budget, Job, Policy, Row, Scenario};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimArgs {
    #[command(subcommand)]
    pub command: Option<SimCommand>,
    /// Cluster sizes N to sweep (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub nodes: Option<Vec<usize>>,
    /// Data splits k.
    #[arg(long = "data-splits", short = 'k', value_delimiter = ',')]
    pub data_splits: Option<Vec<usize>>,
    /// Parity splits r.
    #[arg(long = "parity-splits", short = 'r', value_delimiter = ',')]
    pub parity_splits: Option<Vec<usize>>,
    /// CodingSets load-balancing factor l.
    #[arg(long = "load-balancing-factor", short = 'l', value_delimiter = ',')]
    pub load_balancing_factor: Option<Vec<usize>>,
    /// Mean slabs per node S.
    #[arg(long, value_delimiter = ',')]
    pub slabs_per_node: Option<Vec<usize>>,
    /// Percentage of nodes failing at once, f.
    #[arg(long, value_delimiter = ',')]
    pub failed_percent: Option<Vec<f64>>,
    /// Policies for a sweep: codingsets, codingsets-p2c, codingsets-least, ec-cache, p2c-slab,
    /// least-loaded (default: all).
    #[arg(long, value_delimiter = ',')]
    pub policies: Option<Vec<String>>,
    /// The figures' full ranges (N up to 1M, r to 4, S to 100, f to 5%) and more trials.
    /// Takes minutes to tens of minutes.
    #[arg(long)]
    pub full: bool,
    /// Independent layouts per point (overrides the budget's).
    #[arg(long)]
    pub layouts: Option<usize>,
    /// Maximum failure trials per point (overrides the budget's).
    #[arg(long)]
    pub max_trials: Option<u64>,
    /// Stop a point's trials after this many lost data (overrides the budget's).
    #[arg(long)]
    pub target_losses: Option<u64>,
    /// Base seed; every point's seeds derive from it and the point.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Print JSON (an array of rows) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the rows as CSV to this file.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write figure15.png and figure16.png to this directory (figure runs only).
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// The figure runs at a tenth of the cluster sizes with one layout and 2000 trials per
    /// point: seconds, for tests that keep the command from rotting. Numbers are not meaningful.
    #[arg(long, conflicts_with = "full")]
    pub smoke: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Data lost per year: nodes and racks fail at measured rates over simulated years, lost
    /// slabs are rebuilt at the measured rebuild speed where the placement policy says; per
    /// policy, and rep(2), rep(3), EC(k,r) at equal memory. Loss events and ranges lost per
    /// year, bytes lost per year and nines of durability, with 95% intervals.
    Durability(durability::DurabilityArgs),
}

impl SimArgs {
    fn is_sweep(&self) -> bool {
        self.nodes.is_some()
            || self.data_splits.is_some()
            || self.parity_splits.is_some()
            || self.load_balancing_factor.is_some()
            || self.slabs_per_node.is_some()
            || self.failed_percent.is_some()
    }

    fn budget(&self, base: Budget) -> Budget {
        Budget {
            layouts: self.layouts.unwrap_or(base.layouts),
            max_trials: self.max_trials.unwrap_or(base.max_trials),
            target_losses: self.target_losses.unwrap_or(base.target_losses),
            seed: self.seed,
        }
    }
}

/// The jobs of this invocation with their budgets.
pub fn plan(args: &SimArgs) -> Result<Vec<(Job, Budget)>> {
    let policies = match &args.policies {
        None => Policy::ALL.to_vec(),
        Some(names) => names
            .iter()
            .map(|name| Policy::parse(name).with_context(|| format!("unknown policy {name:?}")))
            .collect::<Result<_>>()?,
    };
    if args.is_sweep() {
        let base = Scenario::BASE;
        let jobs = sweep_jobs(
            args.nodes.as_deref().unwrap_or(&[base.nodes]),
            args.data_splits.as_deref().unwrap_or(&[base.data_splits]),
            args.parity_splits.as_deref().unwrap_or(&[base.parity_splits]),
            args.load_balancing_factor.as_deref().unwrap_or(&[base.load_balancing_factor]),
            args.slabs_per_node.as_deref().unwrap_or(&[base.slabs_per_node]),
            args.failed_percent.as_deref().unwrap_or(&[base.failed_percent]),
            &policies,
        );
        for job in &jobs {
            let s = &job.scenario;
            if s.width() > s.nodes || s.range_count() == 0 || !(0.0..=100.0).contains(&s.failed_percent) {
                bail!("scenario {s:?} places nothing: need k+r <= N, N*S >= k+r and 0 <= f <= 100");
            }
        }
        let budget = args.budget(if args.full { Budget::FULL } else { Budget::ACCEPTANCE });
        return Ok(jobs.into_iter().map(|job| (job, budget)).collect());
    }
    let acceptance = args.budget(if args.full { Budget::FULL } else { Budget::ACCEPTANCE });
    let figures = args.budget(if args.full { Budget::FULL } else { Budget::QUICK });
    let mut jobs: Vec<(Job, Budget)> = acceptance_jobs().into_iter().map(|job| (job, acceptance)).collect();
    jobs.extend(figure15_jobs(args.full).into_iter().map(|job| (job, figures)));
    // Policies that scan every node per range stay at N <= 10,000 (1.6M ranges on a million
    // nodes would take hours); the others cover the whole range.
    jobs.extend(
        figure16_jobs(args.full)
            .into_iter()
            .filter(|job| !(job.policy.scans_every_node() && job.scenario.nodes > 10_000))
            .map(|job| (job, figures)),
    );
    if args.smoke {
        let tiny = Budget { layouts: 1, max_trials: 2_000, target_losses: 200, seed: args.seed };
        jobs = jobs
            .into_iter()
            .map(|(mut job, _)| {
                job.scenario.nodes = (job.scenario.nodes / 10).max(job.scenario.width());
                (job, tiny)
            })
            .collect();
    }
    Ok(jobs.into_iter().filter(|(job, _)| policies.contains(&job.policy)).collect())
}

pub fn run(args: SimArgs) -> Result<()> {
    if let Some(SimCommand::Durability(durability_args)) = args.command {
        return durability::run(durability_args);
    }
    let jobs = plan(&args)?;
    let started = Instant::now();
    let quiet = args.quiet;
    let progress = move |done: usize, total: usize, row: &Row| {
        if !quiet {
            let s = &row.scenario;
            eprintln!(
                "[{done}/{total} {:.0}s] {} {} N={} k={} r={} l={} S={} f={}%: {:.2}s",
                started.elapsed().as_secs_f64(),
                row.experiment,
                row.policy.name(),
                s.nodes,
                s.data_splits,
                s.parity_splits,
                s.load_balancing_factor,
                s.slabs_per_node,
                s.failed_percent,
                row.seconds
            );
        }
    };
    let rows = run_jobs(&jobs, args.threads, &progress).context("placing ranges")?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
    } else {
        crate::write_table(&rows, &mut out)?;
        writeln!(out, "\n{} points in {:.1}s", rows.len(), started.elapsed().as_secs_f64())?;
    }
    if let Some(path) = &args.csv {
        let mut file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        crate::write_csv(&rows, &mut file).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(dir) = &args.plot_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        if rows.iter().any(|r| r.experiment.starts_with("fig15")) {
            plot::figure15(&dir.join("figure15.png"), &rows)?;
        }
        if rows.iter().any(|r| r.experiment.starts_with("fig16")) {
            plot::figure16(&dir.join("figure16.png"), &rows)?;
        }
    }
    Ok(())
}
