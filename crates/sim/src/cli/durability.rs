//! `remem sim durability`: data lost per year by a cluster whose nodes and racks fail at
//! measured rates and whose lost slabs are rebuilt at the measured rebuild speed, per placement
//! policy, and for rep(2), rep(3) and EC(k,r) at equal memory (this crate's `durability`). Progress on stderr, a table or JSON on stdout.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use remem_frontend::units::parse_bytes;

use crate::durability::{run_durability, write_durability_table, Config, DurabilityJob, Scheme};
use crate::Policy;

#[derive(Args, Debug)]
pub struct DurabilityArgs {
    /// Cluster size N.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Data splits k of the EC scheme.
    #[arg(long = "data-splits", short = 'k', default_value_t = 8)]
    pub data_splits: usize,
    /// Parity splits r of the EC scheme.
    #[arg(long = "parity-splits", short = 'r', default_value_t = 2)]
    pub parity_splits: usize,
    /// CodingSets load-balancing factor l.
    #[arg(long = "load-balancing-factor", short = 'l', default_value_t = 2)]
    pub load_balancing_factor: usize,
    /// Slabs per node (every scheme fills the same memory: N*S/(k+r) ranges).
    #[arg(long, default_value_t = 16)]
    pub slabs_per_node: usize,
    /// Slab size (the seed's 1 GiB; `remem bench regen` rebuilds 256 MiB slabs).
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub slab_size: u64,
    /// Nodes per rack (failure domain), consecutive node indices; 1: no racks.
    #[arg(long, default_value_t = 20)]
    pub rack_size: usize,
    /// Placement does not see the racks (every node its own domain): shows what domain-aware
    /// placement buys.
    #[arg(long)]
    pub ignore_racks: bool,
    /// Mean years between permanent failures of one node (memory lost). 0: never.
    #[arg(long, default_value_t = 4.0)]
    pub node_mttf_years: f64,
    /// Mean years between failures of one rack (every node's memory lost). 0: never.
    #[arg(long, default_value_t = 10.0)]
    pub rack_mttf_years: f64,
    /// Mean years between transient failures of one node (unreachable, memory kept). 0: none.
    #[arg(long, default_value_t = 1.0)]
    pub transient_mttf_years: f64,
    /// Mean length of a transient failure, minutes (exponential).
    #[arg(long, default_value_t = 5.0)]
    pub transient_minutes: f64,
    /// Weibull shape of node and rack lifetimes (same means); exponential when absent.
    #[arg(long)]
    pub weibull_shape: Option<f64>,
    /// Seconds from a node going silent to its slabs being rebuilt (the nodes' lease timeout).
    #[arg(long, default_value_t = 10.0)]
    pub detect_seconds: f64,
    /// Rebuild speed of one slab, MiB/s (`remem bench regen` measured 201-213 MiB/s).
    #[arg(long = "rebuild-mib-s", default_value_t = 200.0)]
    pub rebuild_mib_s: f64,
    /// Rebuilds one node runs at once.
    #[arg(long, default_value_t = 1)]
    pub rebuild_parallel: usize,
    /// Hours to replace a dead machine (it comes back empty).
    #[arg(long, default_value_t = 72.0)]
    pub replace_hours: f64,
    /// Simulated years per trial.
    #[arg(long, default_value_t = 50.0)]
    pub years: f64,
    /// Independent trials per row (the interval comes from their spread).
    #[arg(long, default_value_t = 4)]
    pub trials: usize,
    /// Policies for EC(k,r): codingsets, codingsets-p2c, codingsets-least, ec-cache, p2c-slab,
    /// least-loaded.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "codingsets,codingsets-p2c,ec-cache,p2c-slab,least-loaded"
    )]
    pub policies: Vec<String>,
    /// Policy of the rep(2) and rep(3) rows ("none": no such rows).
    #[arg(long, default_value = "codingsets-p2c")]
    pub replication_policy: String,
    /// Base seed; every trial's seed derives from it, the scheme, the policy and the trial.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Print JSON (an array of rows) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

fn policy(name: &str) -> Result<Policy> {
    Policy::parse(name).with_context(|| format!("unknown policy {name:?}"))
}

impl DurabilityArgs {
    fn config(&self) -> Config {
        Config {
            nodes: self.nodes,
            load_balancing_factor: self.load_balancing_factor,
            slabs_per_node: self.slabs_per_node,
            rack_size: self.rack_size.max(1),
            domain_aware: !self.ignore_racks,
            node_mttf_years: self.node_mttf_years,
            rack_mttf_years: self.rack_mttf_years,
            transient_mttf_years: self.transient_mttf_years,
            transient_mean_seconds: self.transient_minutes * 60.0,
            weibull_shape: self.weibull_shape,
            detect_seconds: self.detect_seconds,
            slab_bytes: self.slab_size,
            rebuild_mib_per_second: self.rebuild_mib_s,
            rebuild_parallel: self.rebuild_parallel.max(1),
            replace_hours: self.replace_hours,
        }
    }

    fn jobs(&self) -> Result<Vec<DurabilityJob>> {
        let ec = Scheme { data_splits: self.data_splits, parity_splits: self.parity_splits };
        let mut jobs = Vec::new();
        for name in &self.policies {
            jobs.push(DurabilityJob { scheme: ec, policy: policy(name)? });
        }
        if self.replication_policy != "none" {
            let replication = policy(&self.replication_policy)?;
            for copies in [2, 3] {
                jobs.push(DurabilityJob {
                    scheme: Scheme { data_splits: 1, parity_splits: copies - 1 },
                    policy: replication,
                });
            }
        }
        Ok(jobs)
    }
}

pub fn run(args: DurabilityArgs) -> Result<()> {
    let config = args.config();
    let width = args.data_splits + args.parity_splits;
    if args.data_splits == 0 || width > args.nodes || args.nodes * args.slabs_per_node < width {
        bail!("need k >= 1, k+r <= N and N*S >= k+r");
    }
    let positive = |value: f64| value.is_finite() && value > 0.0;
    if !positive(args.years) || args.trials == 0 || !positive(args.rebuild_mib_s) {
        bail!("--years, --trials and --rebuild-mib-s must be positive");
    }
    if args.weibull_shape.is_some_and(|shape| !positive(shape)) {
        bail!("--weibull-shape must be positive");
    }
    let jobs = args.jobs()?;
    let started = Instant::now();
    let quiet = args.quiet;
    let last_report = std::sync::Mutex::new(0.0f64);
    let progress = |done: usize, total: usize, name: &str, years: f64| {
        if quiet {
            return;
        }
        // At most one line per second, and one per finished trial.
        let elapsed = started.elapsed().as_secs_f64();
        let mut last = last_report.lock().expect("no panics under the lock");
        let finished = years >= args.years;
        if finished || elapsed - *last >= 1.0 {
            *last = elapsed;
            eprintln!("[{done}/{total} trials {elapsed:.0}s] {name}: {years:.0}/{} years", args.years);
        }
    };
    let rows = run_durability(&config, &jobs, args.trials, args.years, args.seed, args.threads, &progress)
        .context("placing ranges")?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "N={} racks of {} ({}), S={} slabs of {} MiB, node MTTF {} y, rack MTTF {} y, transient every {} y for {} min, \
         lease {} s, rebuild {} MiB/s x{} ({:.1} s a slab), replace {} h; {} trials x {} years",
        args.nodes,
        config.rack_size,
        if config.domain_aware { "placement sees them" } else { "placement ignores them" },
        args.slabs_per_node,
        args.slab_size >> 20,
        args.node_mttf_years,
        args.rack_mttf_years,
        args.transient_mttf_years,
        args.transient_minutes,
        args.detect_seconds,
        args.rebuild_mib_s,
        config.rebuild_parallel,
        config.rebuild_seconds(),
        args.replace_hours,
        args.trials,
        args.years,
    )?;
    write_durability_table(&rows, &mut out)?;
    writeln!(
        out,
        "\nlosses: ranges lost in the simulation (events/yr: failures that lost any, Poisson 95%); ranges \
         lost/yr: expected (exposure estimate, 95% over trials); nines: -log10(expected fraction of stored \
         bytes lost per year); down s: mean seconds a slab was unreadable; spare: most machines dead at once."
    )?;
    writeln!(out, "{} rows in {:.1}s", rows.len(), started.elapsed().as_secs_f64())?;
    Ok(())
}
