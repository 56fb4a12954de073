//! `remem bench kv-ha`: the high availability of `remem kv` (docs/KV.md "Standby", seed 004),
//! measured from outside with memcached text-protocol requests, in one run:
//! - throughput and p50/p99 of a YCSB-like mix (Zipfian keys, 20, 50 and 100% sets) with no
//!   standby (the backup region only), one-sided replication, synchronous RPC and log shipping,
//!   as ratios to no standby, and with no backup region at all (`--ephemeral`); the standby's
//!   CPU seconds per million writes (from /proc);
//! - for 1M and 10M items: the restart of the primary (restore from its region), the sync of a
//!   new standby whole-chunk vs per item vs adaptive, and the failover (SIGKILL of the primary
//!   to the first answered get on its address).
//!
//! Every get is checked (the value's stamped key and length), and after the failover a sample of
//! keys is read back: a broken server fails the bench instead of reporting a number.

mod load;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;

use remem_local::stats::Summary;

#[derive(Args, Debug, Clone)]
pub struct KvHaBenchArgs {
    /// Replication set-ups of the throughput series: ephemeral (no backup region), none (the
    /// backup region, no standby), one-sided, rpc, log.
    #[arg(long, value_delimiter = ',', default_value = "ephemeral,none,one-sided,rpc,log")]
    pub modes: Vec<String>,
    /// Percentages of sets in the mix (the rest are gets), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "20,50,100")]
    pub write_ratios: Vec<u32>,
    /// Keys of the throughput series (filled before the first series).
    #[arg(long, default_value_t = 100_000)]
    pub keys: usize,
    /// Value size of the throughput series, in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Connections of the throughput series (one client thread each).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Length of one throughput series, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Rounds of the mixes (each mode's set-up started afresh each round); medians are
    /// reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Zipf exponent of key popularity (YCSB's default 0.99).
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Item counts of the failover and sync measurements (32-byte values), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    pub failover_items: Vec<usize>,
    /// Memory nodes of each local cluster.
    #[arg(long, default_value_t = 12)]
    pub nodes: usize,
    /// Where the clusters and state directories go (default: a new directory under /dev/shm,
    /// so backup regions are memory, not a disk's page cache under writeback).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A tiny run of everything (seconds; used by the tests).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document instead of the tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct MixRow {
    pub mode: String,
    pub write_percent: u32,
    /// Rounds this row is the median of.
    pub rounds: usize,
    pub ops_per_second: f64,
    pub latency: Summary,
    pub writes: u64,
    /// CPU seconds (user + system) of the standby per million writes, if there is one.
    pub standby_cpu_seconds_per_million_writes: Option<f64>,
    /// Ratios to mode `none` at the same write percentage, in this run.
    pub ops_ratio_to_none: Option<f64>,
    pub p50_ratio_to_none: Option<f64>,
    pub p99_ratio_to_none: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct SyncRow {
    pub items: usize,
    pub policy: String,
    /// From the standby's start to the primary's "standby synced".
    pub seconds: f64,
    /// The copy alone, as the primary timed it.
    pub copy_seconds: f64,
    pub records: u64,
    pub chunks_whole: u64,
    pub chunks_by_slot: u64,
}

#[derive(Debug, Serialize)]
pub struct FailoverRow {
    pub items: usize,
    pub load_seconds: f64,
    /// A primary restarted with its items (SIGTERM, start, scan, restore, listening).
    pub restart_seconds: f64,
    /// SIGKILL of the primary to the first get answered on its address.
    pub failover_ms: f64,
    /// The standby's own account: from finding the primary dead to listening.
    pub takeover_ms: Option<f64>,
    pub keys_checked: usize,
}

#[derive(Debug, Serialize)]
pub struct KvHaReport {
    pub mixes: Vec<MixRow>,
    pub syncs: Vec<SyncRow>,
    pub failovers: Vec<FailoverRow>,
}

const MODES: [&str; 5] = ["ephemeral", "none", "one-sided", "rpc", "log"];

pub fn run(mut args: KvHaBenchArgs, binary: &Path) -> Result<KvHaReport> {
    if let Some(mode) = args.modes.iter().find(|mode| !MODES.contains(&mode.as_str())) {
        bail!("unknown mode {mode:?}: one of {}", MODES.join(", "));
    }
    if args.write_ratios.iter().any(|&ratio| ratio > 100) {
        bail!("--write-ratios are percentages, 0 to 100");
    }
    if args.keys == 0 || args.connections == 0 || args.value_size == 0 || args.value_size > 1 << 20 {
        bail!("--keys and --connections must be positive, --value-size 1 byte to 1 MiB");
    }
    if args.rounds == 0 || args.rounds > 100 {
        bail!("--rounds must be 1 to 100");
    }
    if args.seconds <= 0.0 || args.zipf < 0.0 || args.failover_items.contains(&0) || args.nodes < 10 {
        bail!(
            "--seconds must be positive, --zipf at least 0, --failover-items positive, --nodes at least 10"
        );
    }
    if args.quick {
        args.keys = 2000;
        args.connections = 2;
        args.seconds = 0.5;
        args.failover_items = vec![5000];
        args.rounds = 1;
    }
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            let base =
                if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
            base.join(format!("remem-kv-ha-{}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&dir)?;
    let result = load::measure(&args, binary, &dir);
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let mut report = result?;
    ratios(&mut report.mixes);
    Ok(report)
}

fn ratios(rows: &mut [MixRow]) {
    let baselines: Vec<(u32, f64, f64, f64)> = rows
        .iter()
        .filter(|row| row.mode == "none")
        .map(|row| (row.write_percent, row.ops_per_second, row.latency.p50_us, row.latency.p99_us))
        .collect();
    for row in rows {
        if let Some(&(_, ops, p50, p99)) = baselines.iter().find(|baseline| baseline.0 == row.write_percent) {
            row.ops_ratio_to_none = Some(row.ops_per_second / ops);
            row.p50_ratio_to_none = Some(row.latency.p50_us / p50);
            row.p99_ratio_to_none = Some(row.latency.p99_us / p99);
        }
    }
}

pub fn print_table(report: &KvHaReport) {
    let ratio = |value: Option<f64>| value.map(|value| format!("{value:.2}")).unwrap_or_else(|| "-".into());
    println!(
        "YCSB-like mix, Zipfian keys, medians of {} rounds: ratios to `none` (backup region, no standby) at the \
         same write %",
        report.mixes.first().map(|row| row.rounds).unwrap_or(0)
    );
    println!(
        "{:<10} {:>6} {:>10} {:>6} {:>9} {:>6} {:>9} {:>6} {:>22}",
        "mode", "sets%", "ops/s", "ratio", "p50 us", "ratio", "p99 us", "ratio", "standby CPU s/M writes"
    );
    for row in &report.mixes {
        println!(
            "{:<10} {:>6} {:>10.0} {:>6} {:>9.1} {:>6} {:>9.1} {:>6} {:>22}",
            row.mode,
            row.write_percent,
            row.ops_per_second,
            ratio(row.ops_ratio_to_none),
            row.latency.p50_us,
            ratio(row.p50_ratio_to_none),
            row.latency.p99_us,
            ratio(row.p99_ratio_to_none),
            row.standby_cpu_seconds_per_million_writes
                .map(|cpu| format!("{cpu:.2}"))
                .unwrap_or_else(|| "-".into())
        );
    }
    println!();
    println!("New standby synced while the primary serves (one-sided)");
    println!(
        "{:>10} {:<9} {:>9} {:>9} {:>10} {:>8} {:>8}",
        "items", "policy", "total s", "copy s", "records", "whole", "by slot"
    );
    for row in &report.syncs {
        println!(
            "{:>10} {:<9} {:>9.3} {:>9.3} {:>10} {:>8} {:>8}",
            row.items,
            row.policy,
            row.seconds,
            row.copy_seconds,
            row.records,
            row.chunks_whole,
            row.chunks_by_slot
        );
    }
    println!();
    println!("Failover (SIGKILL of the primary to the first get answered) and restart");
    println!(
        "{:>10} {:>8} {:>10} {:>12} {:>12} {:>8}",
        "items", "load s", "restart s", "failover ms", "takeover ms", "checked"
    );
    for row in &report.failovers {
        println!(
            "{:>10} {:>8.1} {:>10.2} {:>12.1} {:>12} {:>8}",
            row.items,
            row.load_seconds,
            row.restart_seconds,
            row.failover_ms,
            row.takeover_ms.map(|ms| format!("{ms:.0}")).unwrap_or_else(|| "-".into()),
            row.keys_checked
        );
    }
}

/// How long a client waits on one request.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
