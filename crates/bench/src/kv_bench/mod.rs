//! `remem bench kv`: `remem kv` beside Debian's `memcached`, measured from outside by stock
//! memcached text-protocol requests, in the same run, as ratios.
//!
//! Three measurements:
//! - GET and SET latency (p50, p99) and throughput of fixed-size values with 1 and 32
//!   connections (one thread each), for every remem scheme (one `remem kv --scheme S` process
//!   each, on one local cluster) and for memcached. GETs read a key space filled first.
//! - Transitions of one object to EC(8,2): the naive way (read the rep(2) object, write it
//!   coded) against the EOR way (an `eor2` object turned into EC(8,2)), bytes and time as
//!   `remem kv` reports them for `transition <key> ec8+2 [naive]`.
//! - Reads racing a write and reads racing reads of one key (1 SET and 3 GETs on other
//!   connections at once; 4 GETs at once), with the work table's data bypassing on and off.
//!
//! Every value read back is checked (length and stamped key index; whole bytes in the racing
//! reads, which must return the old or the new value), so a broken server fails the bench
//! instead of reporting a number. The module also holds what the tests of `remem kv` share with
//! the bench: the text-protocol client ([`TextClient`]) and the server processes
//! ([`ServerProcess`]: memcached on an ephemeral port, `remem kv`), stopped by PID on drop.

mod client;
mod load;
mod process;
mod report;
mod values;

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;

use remem_local::units::{format_bytes, parse_bytes};

pub use client::{ClientError, Item, StoreOutcome, TextClient, Transition, MAX_VALUE_BYTES};
pub use process::{remem_kv_available, ServerProcess};
pub use report::{print_table, KvBenchReport, KvSeries, RaceRow, TransitionRow};
pub use values::value_for;

use load::{measure_races, measure_target, measure_transitions};
use process::{memcached_version, RememKvOnCluster};

#[derive(Args, Debug, Clone)]
pub struct KvBenchArgs {
    /// Operations per series (all connections together); a series also stops after --seconds.
    #[arg(long, default_value_t = 20_000)]
    pub ops: usize,
    /// Longest time of one series, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Value sizes, comma separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_value = "100,1KiB,4KiB,64KiB,512KiB")]
    pub sizes: Vec<u64>,
    /// Connection counts, comma separated (one client thread per connection).
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub connections: Vec<usize>,
    /// remem schemes to measure, comma separated (one `remem kv --scheme S` each).
    #[arg(long, value_delimiter = ',', default_value = "none,rep2,ec8+2,eor2")]
    pub schemes: Vec<String>,
    /// Object sizes of the transition measurement, comma separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_value = "1KiB,4KiB,16KiB,64KiB,256KiB,1MiB,4MiB")]
    pub transition_sizes: Vec<u64>,
    /// Rounds of the racing-reads measurement (per bypass setting).
    #[arg(long, default_value_t = 200)]
    pub race_rounds: usize,
    /// Value size of the racing-reads measurement.
    #[arg(long, default_value = "64KiB", value_parser = parse_bytes)]
    pub race_size: u64,
    /// Memory nodes of the local cluster.
    #[arg(long, default_value_t = 12)]
    pub nodes: usize,
    /// How remem kv reaches its nodes (all on this host): tcp, or shm (their slabs mapped as
    /// shared memory, control over Unix sockets). memcached is the same either way.
    #[arg(long, value_enum, default_value = "tcp")]
    pub transport: remem_frontend::transport_arg::Transport,
    /// The memcached program to compare with.
    #[arg(long, default_value = "memcached")]
    pub memcached: String,
    /// memcached's worker threads (`-t`; its default, 4, when not given).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub memcached_threads: Option<u16>,
    /// `remem kv --threads` values to measure each scheme with, comma separated (a row per
    /// scheme and count; rows of more than one thread are named `... tN`).
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: Vec<u16>,
    /// One more argument for every `remem kv` the benchmark starts (repeat it for several:
    /// `--kv-arg=--spin-us --kv-arg=0`).
    #[arg(long, allow_hyphen_values = true)]
    pub kv_arg: Vec<String>,
    /// A tiny run of everything (seconds; used by the tests): 1 KiB values, 1 and 4
    /// connections, 200 ops per series, two transition sizes, 10 racing rounds.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document instead of the tables.
    #[arg(long)]
    pub json: bool,
}

/// Bytes of keys per (target, size) the GET series read from; fewer keys for larger values.
fn key_space(value_bytes: u64, quick: bool) -> usize {
    let budget: u64 = if quick { 1 << 20 } else { 16 << 20 };
    (budget / value_bytes.max(1)).clamp(16, 1000) as usize
}

const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);

impl KvBenchArgs {
    /// `--quick`: a few operations of one size, for the tests.
    fn quick_sizes(&mut self) {
        self.ops = self.ops.min(200);
        self.seconds = self.seconds.min(2.0);
        self.sizes = vec![1 << 10];
        self.connections = vec![1, 4];
        self.transition_sizes = vec![1 << 10, 64 << 10];
        self.race_rounds = self.race_rounds.min(10);
        self.race_size = 4 << 10;
    }
}

/// Each row's ratios to memcached's row of the same operation, size and connections, and a
/// warning per row that saw errors or misses.
fn compare_to_memcached(series: &mut [KvSeries], warnings: &mut Vec<String>) {
    // Ratios to memcached, same operation, size and connections.
    let baselines: Vec<(String, u64, usize, f64, f64, f64)> = series
        .iter()
        .filter(|s| s.target == "memcached")
        .map(|s| {
            (
                s.operation.clone(),
                s.value_bytes,
                s.connections,
                s.latency.p50_us,
                s.latency.p99_us,
                s.ops_per_second,
            )
        })
        .collect();
    for row in series.iter_mut() {
        if let Some(&(_, _, _, p50, p99, ops)) = baselines
            .iter()
            .find(|base| base.0 == row.operation && base.1 == row.value_bytes && base.2 == row.connections)
        {
            row.p50_ratio_to_memcached = Some(row.latency.p50_us / p50);
            row.p99_ratio_to_memcached = Some(row.latency.p99_us / p99);
            row.ops_ratio_to_memcached = Some(row.ops_per_second / ops);
        }
        if row.errors > 0 {
            warnings.push(format!(
                "{} {} {} x{}: {} errors or misses",
                row.target,
                row.operation,
                format_bytes(row.value_bytes),
                row.connections,
                row.errors
            ));
        }
    }
}

pub fn run(mut args: KvBenchArgs, binary: &Path) -> Result<KvBenchReport> {
    if args.quick {
        args.quick_sizes();
    }
    if args.sizes.is_empty() || args.connections.contains(&0) {
        bail!("--sizes must name at least one size and --connections only positive counts");
    }
    let largest = args.sizes.iter().copied().max().unwrap_or(0).max(args.race_size);
    let largest_transition = args.transition_sizes.iter().copied().max().unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("remem-bench-kv-{}", std::process::id()));
    remem_local::launcher::private_directory(&dir)?;
    let mut warnings = Vec::new();
    let mut series = Vec::new();

    // memcached first, alone on the machine.
    let mut version = memcached_version(&args.memcached);
    if let Some(threads) = args.memcached_threads {
        version = format!("{version} -t {threads}");
    }
    let memory_mib = if args.quick { 64 } else { 1024 };
    let max_item = (largest + (64 << 10)).next_power_of_two().max(1 << 20);
    {
        eprintln!("memcached ({version}) ...");
        let server = ServerProcess::start_memcached_with_threads(
            &args.memcached,
            (memory_mib, max_item),
            args.memcached_threads.map(usize::from),
            &dir.join("memcached.log"),
        )?;
        measure_target(&args, &server, &mut series)?;
    }

    let remem_kv = remem_kv_available(binary);
    let mut transitions = Vec::new();
    let mut races = Vec::new();
    if !remem_kv {
        warnings.push(format!(
            "{} has no `kv` command: measured memcached only (no remem rows)",
            binary.display()
        ));
    } else {
        let item_limit = max_item.max((largest_transition + (64 << 10)).next_power_of_two());
        let series_memory: u64 =
            args.sizes.iter().map(|&size| key_space(size, args.quick) as u64 * (size + 100)).sum();
        for scheme in &args.schemes {
            for &threads in &args.threads {
                let name = match threads {
                    1 => format!("remem {scheme}"),
                    _ => format!("remem {scheme} t{threads}"),
                };
                eprintln!("{name} ...");
                let words = ["--scheme", scheme.as_str(), "--threads", &threads.to_string()];
                let kv =
                    RememKvOnCluster::start(binary, &args, &dir, &name, series_memory, item_limit, &words)?;
                measure_target(&args, &kv.server, &mut series)?;
            }
        }
        if !args.transition_sizes.is_empty() {
            eprintln!("transitions ...");
            // Each object is deleted after its transition: room for two at a time is enough.
            let memory = 4 * largest_transition;
            let kv = RememKvOnCluster::start(
                binary,
                &args,
                &dir,
                "remem auto",
                memory,
                item_limit,
                &["--scheme", "auto"],
            )?;
            transitions = measure_transitions(&args, &kv.server)?;
        }
        for (mode, extra) in [("bypass", &[][..]), ("no-bypass", &["--no-bypass"][..])] {
            eprintln!("racing reads, {mode} ...");
            let mut words = vec!["--scheme", "ec8+2"];
            words.extend_from_slice(extra);
            let memory = args.race_rounds as u64 * (args.race_size + 100);
            let name = format!("remem ec8+2 {mode}");
            let kv = RememKvOnCluster::start(binary, &args, &dir, &name, memory, item_limit, &words)?;
            races.push(measure_races(&args, &kv.server, mode)?);
        }
    }

    compare_to_memcached(&mut series, &mut warnings);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(KvBenchReport {
        nodes: args.nodes,
        transport: args.transport,
        memcached_version: version,
        remem_kv,
        series,
        transitions,
        races,
        warnings,
    })
}
