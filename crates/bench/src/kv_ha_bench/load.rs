//! The measurements of `remem bench kv-ha`: set-ups (a local cluster, a primary, a standby),
//! the YCSB-like mixes, the bulk load, the syncs and the failover.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{FailoverRow, KvHaBenchArgs, KvHaReport, MixRow, SyncRow, CLIENT_TIMEOUT};
use crate::apps_bench::workload::Zipf;
use crate::kv_bench::{value_for, ServerProcess, StoreOutcome, TextClient};
use remem_local::launcher::{ClusterOptions, LocalCluster, UnixSockets};
use remem_local::stats::{cpu_seconds, Samples, Summary};

/// Value size of the failover measurement's items.
const ITEM_BYTES: usize = 32;
/// Keys read back after each failover.
const CHECKED_KEYS: usize = 1000;
/// The longest a primary may take to start (a restore of 10M items included).
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// A cluster with a primary and maybe a standby; dropped in that order (standby first).
struct Setup {
    standby: Option<ServerProcess>,
    primary: ServerProcess,
    cluster: LocalCluster,
    kv_args: Vec<String>,
    dir: std::path::PathBuf,
    starts: usize,
}

impl Setup {
    /// A cluster of `args.nodes` nodes with room for an EC(8,2) region of `memory_limit`, and
    /// `remem kv --scheme ec8+2 -m memory_limit EXTRA` on it.
    fn start(
        binary: &Path,
        args: &KvHaBenchArgs,
        dir: &Path,
        label: &str,
        memory_limit: u64,
        extra: &[&str],
    ) -> Result<Setup> {
        let slab_bytes: u64 = if args.quick { 1 << 20 } else { 16 << 20 };
        let per_node = memory_limit * 5 / 4 / (args.nodes as u64 - 2);
        let options = ClusterOptions {
            lease_grace: None,
            nodes: args.nodes,
            capacity_bytes: (per_node * 3 / 2).next_multiple_of(slab_bytes) + 4 * slab_bytes,
            slab_size_bytes: slab_bytes,
            nodes_per_domain: 1,
            dir: dir.join(format!("cluster-{label}")),
            fault_injection: false,
            monitor_args: None,
            unix_sockets: UnixSockets::All,
            encrypt: false,
        };
        let cluster = LocalCluster::start(binary, &options)
            .with_context(|| format!("{label}: starting the cluster"))?;
        let mut kv_args: Vec<String> = ["--scheme", "ec8+2", "-m", &memory_limit.to_string()]
            .iter()
            .map(|arg| arg.to_string())
            .collect();
        kv_args.extend(extra.iter().map(|arg| arg.to_string()));
        let primary =
            spawn(binary, &cluster, &kv_args, &dir.join(format!("{label}-primary-0.log")), "primary", true)?;
        Ok(Setup { standby: None, primary, cluster, kv_args, dir: dir.to_owned(), starts: 1 })
    }

    /// Stops the primary (SIGTERM) and starts it again with `extra` flags; returns the time
    /// from the start to `listening` (its restore).
    fn restart_primary(&mut self, binary: &Path, label: &str, extra: &[&str]) -> Result<Duration> {
        self.primary.stop(Duration::from_secs(60));
        let mut args = self.kv_args.clone();
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let log = self.dir.join(format!("{label}-primary-{}.log", self.starts));
        self.starts += 1;
        let started = Instant::now();
        self.primary = spawn(binary, &self.cluster, &args, &log, "primary", true)?;
        Ok(started.elapsed())
    }

    /// Starts a standby and waits for the primary to say it is synced; returns the time taken.
    fn attach_standby(&mut self, binary: &Path, label: &str) -> Result<Duration> {
        let synced_before = self.primary.log_full().matches("standby synced").count();
        let mut args = self.kv_args.clone();
        args.push("--standby".into());
        let log = self.dir.join(format!("{label}-standby-{}.log", self.starts));
        let started = Instant::now();
        self.standby = Some(spawn(binary, &self.cluster, &args, &log, "standby", false)?);
        let deadline = started + START_TIMEOUT;
        while self.primary.log_full().matches("standby synced").count() == synced_before {
            let standby = self.standby.as_mut().expect("started above");
            if standby.exited().is_some() {
                bail!("{label}: the standby exited: {}", standby.log());
            }
            if Instant::now() > deadline {
                bail!("{label}: the standby did not sync in {START_TIMEOUT:?}: {}", self.primary.log());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(started.elapsed())
    }
}

fn spawn(
    binary: &Path,
    cluster: &LocalCluster,
    args: &[String],
    log: &Path,
    name: &str,
    wait: bool,
) -> Result<ServerProcess> {
    let (mut process, first_line) =
        ServerProcess::spawn_remem_kv(binary, &cluster.cluster_file_path, args, log, name)?;
    // A standby's first line comes only after a takeover; its output is drained either way.
    if wait {
        process.wait_listening(&first_line, START_TIMEOUT)?;
    }
    Ok(process)
}

pub(super) fn measure(args: &KvHaBenchArgs, binary: &Path, dir: &Path) -> Result<KvHaReport> {
    let mut report = KvHaReport { mixes: Vec::new(), syncs: Vec::new(), failovers: Vec::new() };
    let memory_limit =
        ((args.keys * (args.value_size + 120)) as u64 * 2).max(64 << 20).next_multiple_of(1 << 20);
    let mut rows = Vec::new();
    for round in 0..args.rounds {
        // Each round starts at another mode, so a drift of the machine is spread over all.
        let mut modes = args.modes.clone();
        let first = round % modes.len().max(1);
        modes.rotate_left(first);
        for mode in &modes {
            mix_round(args, binary, dir, mode, round, memory_limit, &mut rows)?;
        }
    }
    report.mixes = medians(&args.modes, &args.write_ratios, rows);
    for &items in &args.failover_items {
        failover(args, binary, dir, items, &mut report)?;
    }
    Ok(report)
}

/// Per mode and write percentage, the median of the rounds' ops/s, p50, p99 and standby CPU.
fn medians(modes: &[String], percents: &[u32], rows: Vec<MixRow>) -> Vec<MixRow> {
    let median = |mut values: Vec<f64>| -> f64 {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut merged = Vec::new();
    for mode in modes {
        for &percent in percents {
            let of: Vec<&MixRow> =
                rows.iter().filter(|row| &row.mode == mode && row.write_percent == percent).collect();
            if of.is_empty() {
                continue;
            }
            let pick = |field: fn(&MixRow) -> f64| median(of.iter().map(|row| field(row)).collect());
            let cpu: Vec<f64> =
                of.iter().filter_map(|row| row.standby_cpu_seconds_per_million_writes).collect();
            merged.push(MixRow {
                mode: mode.clone(),
                write_percent: percent,
                rounds: of.len(),
                ops_per_second: pick(|row| row.ops_per_second),
                latency: Summary {
                    count: of.iter().map(|row| row.latency.count).sum(),
                    p50_us: pick(|row| row.latency.p50_us),
                    p99_us: pick(|row| row.latency.p99_us),
                    p999_us: pick(|row| row.latency.p999_us),
                    mean_us: pick(|row| row.latency.mean_us),
                },
                writes: of.iter().map(|row| row.writes).sum(),
                standby_cpu_seconds_per_million_writes: (!cpu.is_empty()).then(|| median(cpu)),
                ops_ratio_to_none: None,
                p50_ratio_to_none: None,
                p99_ratio_to_none: None,
            });
        }
    }
    merged
}

/// One round of one mode: a cluster, a primary (and a standby), filled, every write percentage.
fn mix_round(
    args: &KvHaBenchArgs,
    binary: &Path,
    dir: &Path,
    mode: &str,
    round: usize,
    memory_limit: u64,
    rows: &mut Vec<MixRow>,
) -> Result<()> {
    let label = format!("mix-{mode}-{round}");
    let extra: Vec<&str> = match mode {
        "ephemeral" => vec!["--ephemeral"],
        "none" => vec![],
        replication => vec!["--replication", replication],
    };
    let mut setup = Setup::start(binary, args, dir, &label, memory_limit, &extra)?;
    if !matches!(mode, "ephemeral" | "none") {
        setup.attach_standby(binary, &label)?;
    }
    fill(setup.primary.address, args.keys, args.value_size, 2)?;
    for &percent in &args.write_ratios {
        let cpu_before = setup.standby.as_ref().map(|standby| cpu_seconds(standby.pid())).transpose()?;
        let (mut samples, writes, elapsed) = mix(args, setup.primary.address, percent)?;
        let cpu = match (cpu_before, setup.standby.as_ref()) {
            (Some(before), Some(standby)) => Some(cpu_seconds(standby.pid())? - before),
            _ => None,
        };
        let latency = samples.summarize();
        let row = MixRow {
            mode: mode.to_owned(),
            write_percent: percent,
            rounds: 1,
            ops_per_second: latency.count as f64 / elapsed.as_secs_f64(),
            latency,
            writes,
            standby_cpu_seconds_per_million_writes: cpu.map(|cpu| cpu / (writes.max(1) as f64 / 1e6)),
            ops_ratio_to_none: None,
            p50_ratio_to_none: None,
            p99_ratio_to_none: None,
        };
        eprintln!(
            "{mode:<10} {percent:>3}% sets: {:.0} ops/s, p50 {:.1} us, p99 {:.1} us{}",
            row.ops_per_second,
            row.latency.p50_us,
            row.latency.p99_us,
            row.standby_cpu_seconds_per_million_writes
                .map(|cpu| format!(", standby {cpu:.2} CPU s per million writes"))
                .unwrap_or_default()
        );
        rows.push(row);
    }
    Ok(())
}

/// Loads `items`, syncs a new standby per policy (restarting the primary with each `--sync`),
/// then kills the primary and times the standby's takeover.
fn failover(
    args: &KvHaBenchArgs,
    binary: &Path,
    dir: &Path,
    items: usize,
    report: &mut KvHaReport,
) -> Result<()> {
    let label = format!("failover-{items}");
    let memory_limit = ((items * 200) as u64 + (64 << 20)).next_multiple_of(1 << 20);
    let mut setup = Setup::start(binary, args, dir, &label, memory_limit, &[])?;
    let started = Instant::now();
    fill(setup.primary.address, items, ITEM_BYTES, 2)?;
    let load_seconds = started.elapsed().as_secs_f64();
    eprintln!("{items} items loaded in {load_seconds:.1} s");
    let mut restart_seconds = 0.0;
    for policy in ["adaptive", "bulk", "per-item"] {
        if policy != "adaptive" {
            if let Some(mut standby) = setup.standby.take() {
                // Killed before the primary stops, or it would take over.
                standby.stop(Duration::ZERO);
            }
            restart_seconds = setup.restart_primary(binary, &label, &["--sync", policy])?.as_secs_f64();
            eprintln!("{items} items: primary restarted (restore included) in {restart_seconds:.2} s");
        }
        let seconds = setup.attach_standby(binary, &label)?.as_secs_f64();
        let (records, chunks_whole, chunks_by_slot, copy_seconds) =
            last_sync_line(&setup.primary.log_full())?;
        eprintln!(
            "{items} items, sync {policy}: {seconds:.3} s ({copy_seconds:.3} s copying {records} records, {chunks_whole} chunks whole, {chunks_by_slot} by slot)"
        );
        report.syncs.push(SyncRow {
            items,
            policy: policy.into(),
            seconds,
            copy_seconds,
            records,
            chunks_whole,
            chunks_by_slot,
        });
    }
    let address = setup.primary.address;
    // SAFETY: kill with the PID of a child this bench spawned and has not reaped.
    unsafe { libc::kill(setup.primary.pid() as libc::pid_t, libc::SIGKILL) };
    let killed = Instant::now();
    let deadline = killed + START_TIMEOUT;
    let mut client = loop {
        if let Ok(mut client) = TextClient::connect(address, CLIENT_TIMEOUT) {
            let mut value = Vec::new();
            if client.get_into("f0", &mut value).is_ok() {
                break client;
            }
        }
        let standby = setup.standby.as_mut().expect("attached");
        if standby.exited().is_some() {
            bail!("{label}: the standby exited instead of taking over: {}", standby.log());
        }
        if Instant::now() > deadline {
            bail!("{label}: no answer on {address} {START_TIMEOUT:?} after the primary's SIGKILL");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let failover_ms = killed.elapsed().as_secs_f64() * 1e3;
    let standby_log = setup.standby.as_ref().expect("attached").log_full();
    let takeover_ms = standby_log
        .lines()
        .find_map(|line| line.split("serving ").nth(1)?.split(" ms after").next()?.parse::<f64>().ok());
    let mut rng = StdRng::seed_from_u64(items as u64);
    let mut value = Vec::new();
    for _ in 0..CHECKED_KEYS {
        let index = rng.gen_range(0..items as u64);
        let key = format!("f{index}");
        if !client.get_into(&key, &mut value)? || value != value_for(index, 0, ITEM_BYTES) {
            bail!("{label}: after the failover {key} is missing or wrong");
        }
    }
    eprintln!("{items} items: failover in {failover_ms:.1} ms (takeover {takeover_ms:?} ms); {CHECKED_KEYS} keys checked");
    report.failovers.push(FailoverRow {
        items,
        load_seconds,
        restart_seconds,
        failover_ms,
        takeover_ms,
        keys_checked: CHECKED_KEYS,
    });
    // The standby is the primary now: it stops first (field order), then the cluster.
    Ok(())
}

/// The numbers of the primary's last "standby synced: R records in C chunks (B copied whole, I
/// slot by slot) in S s" line.
fn last_sync_line(log: &str) -> Result<(u64, u64, u64, f64)> {
    let line = log.lines().rev().find(|line| line.starts_with("standby synced:")).context("no sync line")?;
    let numbers: Vec<f64> = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|word| !word.is_empty() && *word != ".")
        .filter_map(|word| word.parse().ok())
        .collect();
    match numbers[..] {
        [records, _chunks, whole, by_slot, seconds] => {
            Ok((records as u64, whole as u64, by_slot as u64, seconds))
        }
        _ => bail!("cannot read {line:?}"),
    }
}

/// Sets keys `f0 .. f(items-1)` to `value_for(index, 0, value_bytes)`, pipelined with noreply
/// on `connections` connections, then checks that the server holds them all.
fn fill(address: SocketAddr, items: usize, value_bytes: usize, connections: usize) -> Result<()> {
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..connections)
            .map(|connection| {
                scope.spawn(move || -> Result<()> {
                    let mut client = TextClient::connect(address, CLIENT_TIMEOUT)?;
                    let mut batch = Vec::with_capacity(512 * (value_bytes + 48));
                    let indexes: Vec<usize> = (connection..items).step_by(connections).collect();
                    for chunk in indexes.chunks(512) {
                        batch.clear();
                        for &index in chunk {
                            batch.extend_from_slice(
                                format!("set f{index} 0 0 {value_bytes} noreply\r\n").as_bytes(),
                            );
                            batch.extend_from_slice(&value_for(index as u64, 0, value_bytes));
                            batch.extend_from_slice(b"\r\n");
                        }
                        client.send_raw(&batch)?;
                    }
                    // Everything before it was taken once this is answered.
                    let version = client.request_line("version")?;
                    if !version.starts_with("VERSION") {
                        bail!("version answered {version:?}");
                    }
                    Ok(())
                })
            })
            .collect();
        for handle in handles {
            handle.join().map_err(|_| anyhow::anyhow!("a loader thread panicked"))??;
        }
        Ok(())
    })?;
    let stats = TextClient::connect(address, CLIENT_TIMEOUT)?.stats()?;
    let held: usize = stats.get("curr_items").and_then(|count| count.parse().ok()).unwrap_or(0);
    if held != items {
        bail!("the server holds {held} items after loading {items} (evictions? a larger -m is needed)");
    }
    Ok(())
}

/// One series of the mix: `args.connections` clients for `args.seconds`, each op a set with
/// probability `percent`% else a checked get, keys drawn from a Zipf distribution.
fn mix(args: &KvHaBenchArgs, address: SocketAddr, percent: u32) -> Result<(Samples, u64, Duration)> {
    let zipf = Zipf::new(args.keys, args.zipf);
    let limit = Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let results = std::thread::scope(|scope| {
        let zipf = &zipf;
        let handles: Vec<_> = (0..args.connections)
            .map(|thread| {
                scope.spawn(move || -> Result<(Samples, u64)> {
                    let mut client = TextClient::connect(address, CLIENT_TIMEOUT)?;
                    let mut rng = StdRng::seed_from_u64(thread as u64 * 7919 + percent as u64);
                    let mut samples = Samples::with_capacity(1 << 16);
                    let mut writes = 0;
                    let mut value = Vec::new();
                    let deadline = Instant::now() + limit;
                    while Instant::now() < deadline {
                        let index = zipf.sample(rng.gen());
                        let key = format!("f{index}");
                        let expected = value_for(index, 0, args.value_size);
                        let op_started = Instant::now();
                        if rng.gen_range(0..100) < percent {
                            match client.set(&key, &expected)? {
                                StoreOutcome::Stored => writes += 1,
                                other => bail!("set {key} answered {other:?}"),
                            }
                        } else if !client.get_into(&key, &mut value)? || value != expected {
                            bail!("get {key}: missing or wrong ({} bytes)", value.len());
                        }
                        samples.push(op_started.elapsed());
                    }
                    Ok((samples, writes))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))?)
            .collect::<Result<Vec<_>>>()
    })?;
    let elapsed = started.elapsed();
    let mut all = Samples::default();
    let mut writes = 0;
    for (samples, thread_writes) in results {
        all.nanos.extend(samples.nanos);
        writes += thread_writes;
    }
    Ok((all, writes, elapsed))
}
