//! `remem bench`: page latency and throughput of every scheme, each beside its transport floor
//! measured by the same binary, on the same client, in the same run.
//!
//! Schemes go through one code path with other parameters: EC(8,2) with delta 1 and 0,
//! replication rep(2) = (k=1, r=1, delta 0), no redundancy = (k=1, r=0). Over TCP each series
//! runs interleaved, round by round, with its floor: raw one-split reads through the same event
//! loop with no checksum, no coding, in exactly the fan-out its reads make (k+delta reads of
//! page_size/k bytes to the page's range, done at the k-th), or for writes a labelled proxy
//! (bench_floor.rs). Over shared memory the floor is a plain 4 KiB memcpy. Ratios are what to
//! read: these 2-core machines are noisy, and the same noise hits both sides.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use remem_client::cluster::ClusterFile;
use remem_client::{Client, ClientConfig, PageOp, Shape};
use remem_frontend::placement_arg::PlacementArgs;
use remem_frontend::transport_arg::Transport;
use remem_proto::auth::Secret;
use serde::Serialize;

use crate::bench_floor::{self, FanOut, FloorComparison, RangeProbes};
use remem_local::launcher::{ClusterOptions, LocalCluster};
use remem_local::stats::{Samples, Summary};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Use the running cluster of this file (from `remem up`) instead of starting one.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Nodes of the cluster the bench starts when no --cluster is given.
    #[arg(long, default_value_t = 10, value_parser = remem_local::units::parse_count)]
    pub nodes: usize,
    /// Slab size of the cluster the bench starts (64 MiB keeps shared-memory metadata, header
    /// page included, under 1% of slab memory at 512-byte splits).
    #[arg(long, default_value = "64MiB", value_parser = remem_local::units::parse_positive_bytes)]
    pub slab_size: u64,
    /// Address space per scheme; filled completely before measuring.
    #[arg(long, default_value = "128MiB", value_parser = remem_local::units::parse_positive_bytes)]
    pub size: u64,
    /// Operations per latency series at queue depth 1 (queue depth 32 runs 4x as many).
    #[arg(long, default_value_t = 20_000, value_parser = remem_local::units::parse_count)]
    pub ops: usize,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write latency CDFs (queue depth 1) as a PNG to this file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Seed of the random page order (and of the placement).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// Instead of the full run: read latency of EC(8,2) delta 1 and 0 and rep(2) at queue
    /// depth 1, without faults and then with one node delaying every reply by this many
    /// microseconds (seed 000 Figure 11a). The slow node holds a data split of EC range 0.
    #[arg(long = "straggler", value_name = "MICROSECONDS")]
    pub straggler_us: Option<u32>,
    /// Clients poll without blocking this long before they block (see ClientConfig).
    #[arg(long = "spin", value_name = "MICROSECONDS", default_value_t = 0)]
    pub spin_us: u64,
    /// `tcp`, or `shm`: every node on this host is reached over its Unix socket and its slabs
    /// are read and written as shared memory (docs/SHM.md); the floors are then plain copies
    /// instead of socket round trips: one 4 KiB page, and a page gathered from 8 scattered
    /// 512-byte splits (what the memory system alone charges for EC's pattern).
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
    /// Instead of the full run: what `--encrypt` costs. EC(8,2) delta 1 reads and writes at
    /// queue depth 1 over TCP on two clusters of --nodes started by the bench, one plaintext and
    /// one encrypted, interleaved round by round; prints the encrypted p50 over the plaintext
    /// p50 (encrypt_bench.rs).
    #[arg(long, conflicts_with_all = ["straggler_us", "cluster"])]
    pub encryption: bool,
}

#[derive(Debug, Serialize)]
pub struct StragglerRow {
    pub name: String,
    pub healthy: Summary,
    pub straggler: Summary,
    /// The slowed node: the one holding split 0 (first data split, or the primary copy) of this
    /// scheme's range 0, so that every scheme is measured with a slow node on its read path.
    pub slow_node: String,
    /// Fraction of the measured reads whose first k+delta splits include the slow node.
    pub reads_asking_slow_node: f64,
}

#[derive(Debug, Serialize)]
pub struct SeriesResult {
    pub name: String,
    pub operation: String,
    pub queue_depth: usize,
    pub latency: Summary,
    pub ops_per_second: f64,
    /// For a floor or proxy series: the raw fan-out it measures; null for a scheme's series.
    pub fan_out: Option<FanOut>,
    #[serde(skip)]
    pub sorted_nanos: Vec<u64>,
}

#[derive(Debug, Serialize)]
pub struct Ratio {
    pub name: String,
    pub value: f64,
    pub target: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub nodes: usize,
    pub page_bytes: usize,
    pub series: Vec<SeriesResult>,
    pub ratios: Vec<Ratio>,
    /// Over TCP: every scheme series beside its floor (reads) or proxy (writes), measured
    /// interleaved with it.
    pub floors: Vec<FloorComparison>,
    /// One line per series whose p50 beats its floor's by more than noise (empty when honest).
    pub warnings: Vec<String>,
    /// EC(8,2): node memory (slabs + metadata) over the data written.
    pub ec_memory_ratio: f64,
    pub ec_metadata_fraction_of_slab_memory: f64,
    /// With --straggler: the delay and, per scheme, read latency healthy and with one slow node.
    pub straggler: Option<(u32, Vec<StragglerRow>)>,
    /// With --encryption: plaintext against encrypted node traffic.
    pub encryption: Option<crate::encrypt_bench::EncryptionCost>,
}

struct Scheme {
    name: &'static str,
    shape: Shape,
}

const SCHEMES: [Scheme; 4] = [
    Scheme { name: "ec(8,2) d=1", shape: Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 } },
    Scheme { name: "ec(8,2) d=0", shape: Shape { data_splits: 8, parity_splits: 2, extra_reads: 0 } },
    Scheme { name: "rep(2)", shape: Shape { data_splits: 1, parity_splits: 1, extra_reads: 0 } },
    Scheme { name: "none", shape: Shape { data_splits: 1, parity_splits: 0, extra_reads: 0 } },
];

/// Ops per `execute` call; buffers for one chunk are reused. Large enough that the pipeline
/// drains rarely (once per 1024 ops at queue depth 32).
pub(crate) const CHUNK_OPS: usize = 1024;

impl BenchReport {
    /// A report of one special measurement (stragglers, encryption): no series, no ratios.
    fn bare(nodes: usize, page_bytes: usize) -> BenchReport {
        BenchReport {
            nodes,
            page_bytes,
            series: Vec::new(),
            ratios: Vec::new(),
            floors: Vec::new(),
            warnings: Vec::new(),
            ec_memory_ratio: 0.0,
            ec_metadata_fraction_of_slab_memory: 0.0,
            straggler: None,
            encryption: None,
        }
    }
}

pub fn run(args: BenchArgs, binary: &std::path::Path) -> Result<BenchReport> {
    if args.encryption {
        let cost = crate::encrypt_bench::run(&args, binary)?;
        let nodes = cost.nodes;
        return Ok(BenchReport { encryption: Some(cost), ..BenchReport::bare(nodes, 4096) });
    }
    let (cluster, secret, mut own_cluster) = bench_cluster(&args, binary)?;
    let nodes = cluster.addresses();
    let page_bytes = 4096;
    if let Some(delay_us) = args.straggler_us {
        let rows = run_straggler(&args, &nodes, &secret, delay_us)?;
        // A bench that got here succeeded: its scratch cluster's directory goes with it.
        if let Some(cluster) = own_cluster.as_mut() {
            cluster.remove_dir_on_drop();
        }
        drop(own_cluster);
        return Ok(BenchReport {
            straggler: Some((delay_us, rows)),
            ..BenchReport::bare(nodes.len(), page_bytes)
        });
    }
    let mut series = Vec::new();
    let mut floors = Vec::new();
    let mut memory = (0.0, 0.0);
    let mut rng = StdRng::seed_from_u64(args.seed);
    for scheme in &SCHEMES {
        let measured = run_scheme(&args, scheme, (&nodes, &secret), &mut rng, (&mut series, &mut floors))?;
        if let Some(measured) = measured {
            memory = measured;
        }
    }
    // A bench that got here succeeded: its scratch cluster's directory goes with it.
    if let Some(cluster) = own_cluster.as_mut() {
        cluster.remove_dir_on_drop();
    }
    drop(own_cluster);
    if args.transport == Transport::Shm {
        shm_floors(&args, &mut rng, page_bytes, &mut series);
    }
    let ratios = ratios(&series, args.transport);
    let warnings: Vec<String> = floors.iter().filter_map(FloorComparison::warning).collect();
    if args.json {
        // The table prints them; with --json they would otherwise go unseen.
        warnings.iter().for_each(|warning| eprintln!("{warning}"));
    }
    let report = BenchReport {
        nodes: nodes.len(),
        page_bytes,
        series,
        ratios,
        floors,
        warnings,
        ec_memory_ratio: memory.0,
        ec_metadata_fraction_of_slab_memory: memory.1,
        straggler: None,
        encryption: None,
    };
    if let Some(path) = &args.plot {
        plot(&report, path)?;
    }
    Ok(report)
}

/// The cluster of `--cluster`, or a scratch one of `--nodes` started for the bench (returned so
/// the caller keeps it running).
fn bench_cluster(
    args: &BenchArgs,
    binary: &std::path::Path,
) -> Result<(ClusterFile, Secret, Option<LocalCluster>)> {
    match &args.cluster {
        Some(path) => {
            let cluster = ClusterFile::load(path)?;
            let secret = Secret::load(Some(&cluster.secret_file)).context("loading the cluster secret")?;
            Ok((cluster, secret, None))
        }
        None => {
            let dir = std::env::temp_dir().join(format!("remem-bench-{}", std::process::id()));
            let options = ClusterOptions {
                lease_grace: None,
                nodes: args.nodes,
                capacity_bytes: 64 * args.slab_size.max(1 << 20),
                slab_size_bytes: args.slab_size,
                nodes_per_domain: 1,
                dir,
                fault_injection: args.straggler_us.is_some(),
                monitor_args: None,
                unix_sockets: remem_local::launcher::UnixSockets::All,
                encrypt: false,
            };
            eprintln!("starting {} nodes ...", options.nodes);
            let started = LocalCluster::start(binary, &options)?;
            Ok((started.file.clone(), started.secret.clone(), Some(started)))
        }
    }
}

/// One scheme's series (writes and reads at depth 1 and 32, each beside its floor over TCP) into
/// `series` and `floors`. For the first scheme, also its memory ratio and metadata fraction.
fn run_scheme(
    args: &BenchArgs,
    scheme: &Scheme,
    (nodes, secret): (&[remem_client::NodeAddress], &Secret),
    rng: &mut StdRng,
    (series, floors): (&mut Vec<SeriesResult>, &mut Vec<FloorComparison>),
) -> Result<Option<(f64, f64)>> {
    let page_bytes = 4096;
    eprintln!("{}: filling {} ...", scheme.name, remem_local::units::format_bytes(args.size));
    let mut config = ClientConfig::new(scheme.shape, args.size);
    config.allow_shared_domains = args.placement.allow_shared_domains;
    config.max_in_flight = 32;
    config.spin_before_block = Duration::from_micros(args.spin_us);
    config.shared_memory = args.transport == Transport::Shm;
    let mut client = Client::connect(nodes, secret, config, args.placement.build(args.seed))
        .with_context(|| format!("connecting the {} client", scheme.name))?;
    let pages = client.page_count();
    let fill_order: Vec<u64> = (0..pages).collect();
    run_series(&mut client, &fill_order, 32, Operation::Write, page_bytes)?;
    let memory = (scheme.name == SCHEMES[0].name).then(|| {
        let memory = client.memory_report();
        let ratio = (memory.slab_bytes + memory.metadata_bytes) as f64 / memory.address_space_bytes as f64;
        (ratio, memory.metadata_bytes as f64 / memory.slab_bytes as f64)
    });
    // Over TCP every series runs interleaved with its floor (reads) or proxy (writes), on
    // this client and over the pages of the series (bench_floor.rs).
    let probes = match args.transport {
        Transport::Tcp => Some([
            RangeProbes::prepare(&mut client, FanOut::write_proxy(scheme.shape, page_bytes))?,
            RangeProbes::prepare(&mut client, FanOut::read(scheme.shape, page_bytes))?,
        ]),
        Transport::Shm => None,
    };
    for (queue_depth, count) in [(1, args.ops), (32, args.ops * 4)] {
        let order = random_pages(rng, pages, count);
        for operation in [Operation::Write, Operation::Read] {
            let Some([write_probes, read_probes]) = &probes else {
                eprintln!("{}: {} qd{queue_depth} x{count} ...", scheme.name, operation.name());
                let (samples, elapsed) = run_series(&mut client, &order, queue_depth, operation, page_bytes)?;
                series.push(result(scheme.name, operation.name(), queue_depth, samples, elapsed));
                continue;
            };
            let probes = match operation {
                Operation::Write => write_probes,
                Operation::Read => read_probes,
            };
            let (scheme_result, floor_result, comparison) = bench_floor::measure_beside_floor(
                &mut client,
                scheme.name,
                &order,
                queue_depth,
                operation,
                page_bytes,
                probes,
            )?;
            series.push(scheme_result);
            series.push(floor_result);
            floors.push(comparison);
        }
    }
    if args.transport == Transport::Shm {
        let splits = client.shared_memory_splits(0);
        anyhow::ensure!(
            splits == scheme.shape.all_splits(),
            "{}: only splits {splits:#b} of range 0 are on shared memory",
            scheme.name
        );
    }
    client.release().context("releasing slabs")?;
    Ok(memory)
}

/// The floors of shared memory: one 4 KiB copy, and a page gathered from 8 scattered splits.
fn shm_floors(args: &BenchArgs, rng: &mut StdRng, page_bytes: usize, series: &mut Vec<SeriesResult>) {
    for queue_depth in [1, 32] {
        let count = if queue_depth == 1 { args.ops } else { args.ops * 4 };
        eprintln!("floor: memcpy 4KiB x{count} ...");
        let (samples, elapsed) = run_memcpy(rng, args.size, page_bytes, count);
        series.push(result(MEMCPY_FLOOR, "read", queue_depth, samples, elapsed));
    }
    for queue_depth in [1, 32] {
        let count = if queue_depth == 1 { args.ops } else { args.ops * 4 };
        eprintln!("floor: {SCATTERED_FLOOR} x{count} ...");
        let (samples, elapsed) = run_scattered(rng, args.size, page_bytes, count);
        series.push(result(SCATTERED_FLOOR, "read", queue_depth, samples, elapsed));
    }
}

/// The ratios the report leads with, each against a baseline measured in the same run.
fn ratios(series: &[SeriesResult], transport: Transport) -> Vec<Ratio> {
    let p50 = |name: &str, operation: &str, queue_depth: usize| {
        series
            .iter()
            .find(|s| s.name == name && s.operation == operation && s.queue_depth == queue_depth)
            .map_or(f64::NAN, |s| s.latency.p50_us)
    };
    let percentile = |name: &str, operation: &str, pick: fn(&Summary) -> f64| {
        series
            .iter()
            .find(|s| s.name == name && s.operation == operation && s.queue_depth == 1)
            .map_or(f64::NAN, |s| pick(&s.latency))
    };
    let ops_per_second = |name: &str, operation: &str, queue_depth: usize| {
        series
            .iter()
            .find(|s| s.name == name && s.operation == operation && s.queue_depth == queue_depth)
            .map_or(f64::NAN, |s| s.ops_per_second)
    };
    let ratio = |name: &str, value: f64, target: Option<f64>| Ratio { name: name.to_string(), value, target };
    // Targets of shared memory (issue 16): EC reads at replication's cost (seed 000's claim),
    // p99 under 5 us, and depth 32 doing more than depth 1.
    if transport == Transport::Shm {
        vec![
            ratio("ec(8,2) d=1 read p99 us", percentile("ec(8,2) d=1", "read", |l| l.p99_us), Some(5.0)),
            ratio("ec(8,2) d=1 write p99 us", percentile("ec(8,2) d=1", "write", |l| l.p99_us), Some(10.0)),
            ratio(
                "ec(8,2) d=1 read p50 / rep(2) read p50",
                p50("ec(8,2) d=1", "read", 1) / p50("rep(2)", "read", 1),
                Some(1.2),
            ),
            ratio(
                "ec(8,2) d=1 read ops/s qd1 / qd32",
                ops_per_second("ec(8,2) d=1", "read", 1) / ops_per_second("ec(8,2) d=1", "read", 32),
                Some(1.0),
            ),
            ratio(
                "ec(8,2) d=1 write p50 / rep(2) write p50",
                p50("ec(8,2) d=1", "write", 1) / p50("rep(2)", "write", 1),
                None,
            ),
            ratio(
                "ec(8,2) d=1 read p50 / none read p50",
                p50("ec(8,2) d=1", "read", 1) / p50("none", "read", 1),
                None,
            ),
            ratio(
                "rep(2) read p50 / memcpy 4KiB p50",
                p50("rep(2)", "read", 1) / p50(MEMCPY_FLOOR, "read", 1),
                None,
            ),
            ratio(
                "ec(8,2) d=1 read p50 / memcpy 4KiB p50",
                p50("ec(8,2) d=1", "read", 1) / p50(MEMCPY_FLOOR, "read", 1),
                None,
            ),
            // The memory system's own price of EC's access pattern, before any remem code: a
            // page as k scattered splits against one contiguous page.
            ratio(
                "8x512B scattered p50 / memcpy 4KiB p50",
                p50(SCATTERED_FLOOR, "read", 1) / p50(MEMCPY_FLOOR, "read", 1),
                None,
            ),
            ratio(
                "ec(8,2) d=1 read p50 / 8x512B scattered p50",
                p50("ec(8,2) d=1", "read", 1) / p50(SCATTERED_FLOOR, "read", 1),
                None,
            ),
        ]
    } else {
        vec![
            ratio(
                "ec(8,2) d=1 read p50 / its floor p50",
                p50("ec(8,2) d=1", "read", 1) / p50("floor: ec(8,2) d=1", "read", 1),
                Some(1.3),
            ),
            ratio(
                "ec(8,2) d=0 read p50 / its floor p50",
                p50("ec(8,2) d=0", "read", 1) / p50("floor: ec(8,2) d=0", "read", 1),
                Some(1.3),
            ),
            ratio(
                "ec(8,2) d=1 read p50 / rep(2) read p50",
                p50("ec(8,2) d=1", "read", 1) / p50("rep(2)", "read", 1),
                None,
            ),
            ratio(
                "ec(8,2) write p50 / rep(2) write p50",
                p50("ec(8,2) d=1", "write", 1) / p50("rep(2)", "write", 1),
                None,
            ),
            ratio(
                "rep(2) read p50 / its floor p50",
                p50("rep(2)", "read", 1) / p50("floor: rep(2)", "read", 1),
                None,
            ),
            ratio(
                "ec(8,2) d=1 read floor p50 / rep(2) read floor p50",
                p50("floor: ec(8,2) d=1", "read", 1) / p50("floor: rep(2)", "read", 1),
                None,
            ),
        ]
    }
}

/// `--plot PATH`: the latency CDFs of reads (PATH) and writes (PATH's stem + `-write.png`).
fn plot(report: &BenchReport, path: &std::path::Path) -> Result<()> {
    let lines: Vec<crate::plot::Series<'_>> = report
        .series
        .iter()
        .filter(|s| s.queue_depth == 1 && (s.operation == "read"))
        .map(|s| crate::plot::Series { name: &s.name, sorted_nanos: &s.sorted_nanos })
        .collect();
    crate::plot::latency_cdf(path, "page read latency, queue depth 1", &lines)?;
    let writes: Vec<crate::plot::Series<'_>> = report
        .series
        .iter()
        .filter(|s| s.queue_depth == 1 && s.operation == "write")
        .map(|s| crate::plot::Series { name: &s.name, sorted_nanos: &s.sorted_nanos })
        .collect();
    let write_path = path.with_file_name(format!(
        "{}-write.png",
        path.file_stem().and_then(|stem| stem.to_str()).unwrap_or("bench")
    ));
    crate::plot::latency_cdf(&write_path, "page write latency, queue depth 1", &writes)?;
    eprintln!("plots: {} and {}", path.display(), write_path.display());
    Ok(())
}

const MEMCPY_FLOOR: &str = "floor: memcpy 4KiB";

/// The shared-memory floor: one 4 KiB copy from a random page of a buffer as large as a
/// scheme's address space, timed like a page op (two clock reads around it).
fn run_memcpy(rng: &mut StdRng, size: u64, page_bytes: usize, count: usize) -> (Samples, Duration) {
    let pages = (size as usize / page_bytes).max(1);
    let source: Vec<u8> = (0..pages * page_bytes).map(|byte| byte as u8).collect();
    time_copies(random_pages(rng, pages as u64, count), page_bytes, |page, target| {
        let at = page as usize * page_bytes;
        target.copy_from_slice(std::hint::black_box(&source[at..at + page_bytes]));
    })
}

const SCATTERED_FLOOR: &str = "floor: 8x512B scattered";

/// The floor of EC(8,2)'s access pattern over shared memory: a page gathered from its 8 data
/// splits, 512 bytes at the page's slot of 8 separate buffers (the 8 data slabs, each an eighth
/// of the address space), into one 4 KiB target; timed like [`run_memcpy`]. Against the
/// contiguous floor it shows what the memory system itself charges for scattered splits.
fn run_scattered(rng: &mut StdRng, size: u64, page_bytes: usize, count: usize) -> (Samples, Duration) {
    const SPLITS: usize = 8;
    let split_bytes = page_bytes / SPLITS;
    let pages = (size as usize / page_bytes).max(1);
    let slabs: Vec<Vec<u8>> =
        (0..SPLITS).map(|slab| (0..pages * split_bytes).map(|byte| (byte + slab) as u8).collect()).collect();
    time_copies(random_pages(rng, pages as u64, count), page_bytes, |page, target| {
        let at = page as usize * split_bytes;
        for (slab, split) in slabs.iter().zip(target.chunks_exact_mut(split_bytes)) {
            split.copy_from_slice(std::hint::black_box(&slab[at..at + split_bytes]));
        }
    })
}

/// Runs `copy` for each page of `order` into one page-sized target, timing each call.
fn time_copies(
    order: Vec<u64>,
    page_bytes: usize,
    mut copy: impl FnMut(u64, &mut [u8]),
) -> (Samples, Duration) {
    let mut target = vec![0u8; page_bytes];
    let mut samples = Samples::with_capacity(order.len());
    let started = Instant::now();
    for page in order {
        let op_started = Instant::now();
        copy(page, &mut target);
        std::hint::black_box(&mut target);
        samples.push(op_started.elapsed());
    }
    (samples, started.elapsed())
}

/// Seed 000 Figure 11a on this cluster: read p99 with one straggler, per scheme.
fn run_straggler(
    args: &BenchArgs,
    nodes: &[remem_client::NodeAddress],
    secret: &Secret,
    delay_us: u32,
) -> Result<Vec<StragglerRow>> {
    let schemes = &SCHEMES[..3];
    let mut rows = Vec::new();
    let mut rng = StdRng::seed_from_u64(args.seed);
    for scheme in schemes {
        eprintln!("{}: filling {} ...", scheme.name, remem_local::units::format_bytes(args.size));
        let mut config = ClientConfig::new(scheme.shape, args.size);
        config.allow_shared_domains = args.placement.allow_shared_domains;
        // The straggler must not be mistaken for a dead node.
        config.request_timeout = Duration::from_secs(30);
        let mut client = Client::connect(nodes, secret, config, args.placement.build(args.seed))
            .with_context(|| format!("connecting the {} client", scheme.name))?;
        let pages = client.page_count();
        let fill_order: Vec<u64> = (0..pages).collect();
        run_series(&mut client, &fill_order, 32, Operation::Write, 4096)?;
        let slow = client.range_nodes(0)[0];
        let order = random_pages(&mut rng, pages, args.ops);
        let asked = scheme.shape.data_splits + scheme.shape.extra_reads;
        let ranges_asking: Vec<bool> = (0..client.ranges().len())
            .map(|range| client.range_nodes(range)[..asked].contains(&slow))
            .collect();
        let per_range = client.pages_per_range();
        let reads_asking_slow_node =
            order.iter().filter(|&&page| ranges_asking[(page / per_range) as usize]).count() as f64
                / order.len().max(1) as f64;
        eprintln!("{}: read qd1 x{} healthy ...", scheme.name, args.ops);
        let (mut healthy, _) = run_series(&mut client, &order, 1, Operation::Read, 4096)?;
        let address = nodes[slow].address;
        remem_local::faults::inject(
            address,
            secret,
            client.client_id(),
            remem_local::faults::Fault::Delay { delay_us, fraction_ppm: 1_000_000, seed: args.seed },
        )?;
        eprintln!(
            "{}: read qd1 x{} with {address} delaying every reply by {delay_us} us ...",
            scheme.name, args.ops
        );
        let result = run_series(&mut client, &order, 1, Operation::Read, 4096);
        remem_local::faults::inject(address, secret, client.client_id(), remem_local::faults::Fault::Clear)?;
        let (mut slowed, _) = result?;
        rows.push(StragglerRow {
            name: scheme.name.to_string(),
            healthy: healthy.summarize(),
            straggler: slowed.summarize(),
            slow_node: address.to_string(),
            reads_asking_slow_node,
        });
        client.release().context("releasing slabs")?;
    }
    Ok(rows)
}

pub fn print_table(report: &BenchReport) {
    if let Some(cost) = &report.encryption {
        return crate::encrypt_bench::print(cost);
    }
    if let Some((delay_us, rows)) = &report.straggler {
        println!("read latency at queue depth 1, healthy vs one node delaying every reply by {delay_us} us");
        println!("(per scheme, the slow node holds split 0 of its range 0; 'asking' is the share of reads");
        println!(" whose first k+delta splits include it)");
        println!(
            "{:<14} {:>12} {:>12} {:>14} {:>14} {:>10} {:>8}",
            "scheme", "p50 healthy", "p99 healthy", "p50 straggler", "p99 straggler", "p99 ratio", "asking"
        );
        for row in rows {
            println!(
                "{:<14} {:>12.1} {:>12.1} {:>14.1} {:>14.1} {:>10.2} {:>7.0}%",
                row.name,
                row.healthy.p50_us,
                row.healthy.p99_us,
                row.straggler.p50_us,
                row.straggler.p99_us,
                row.straggler.p99_us / row.healthy.p99_us,
                100.0 * row.reads_asking_slow_node
            );
        }
        return;
    }
    println!(
        "{:<26} {:>6} {:>3} {:>10} {:>10} {:>10} {:>12}",
        "series", "op", "qd", "p50 us", "p99 us", "p99.9 us", "ops/s"
    );
    for s in &report.series {
        println!(
            "{:<26} {:>6} {:>3} {:>10.1} {:>10.1} {:>10.1} {:>12.0}",
            s.name,
            s.operation,
            s.queue_depth,
            s.latency.p50_us,
            s.latency.p99_us,
            s.latency.p999_us,
            s.ops_per_second
        );
    }
    println!();
    if !report.floors.is_empty() {
        crate::bench_floor::print_comparisons(&report.floors);
        println!();
    }
    for ratio in &report.ratios {
        match ratio.target {
            Some(target) => println!(
                "{:<52} {:>6.2}  (target <= {target}: {})",
                ratio.name,
                ratio.value,
                if ratio.value <= target { "met" } else { "NOT met" }
            ),
            None => println!("{:<52} {:>6.2}", ratio.name, ratio.value),
        }
    }
    println!();
    println!(
        "ec(8,2) node memory / data written: {:.4} (bar: 1.25 x 1.01 = {:.4}); metadata = {:.3}% of slab memory",
        report.ec_memory_ratio,
        1.25 * 1.01,
        report.ec_metadata_fraction_of_slab_memory * 100.0
    );
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Write,
    Read,
}

impl Operation {
    pub fn name(self) -> &'static str {
        match self {
            Operation::Write => "write",
            Operation::Read => "read",
        }
    }
}

pub(crate) fn random_pages(rng: &mut StdRng, pages: u64, count: usize) -> Vec<u64> {
    let mut all: Vec<u64> = (0..pages).collect();
    all.shuffle(rng);
    (0..count).map(|index| all[index % all.len()]).collect()
}

pub(crate) fn result(
    name: &str,
    operation: &str,
    queue_depth: usize,
    mut samples: Samples,
    elapsed: Duration,
) -> SeriesResult {
    let latency = samples.summarize();
    SeriesResult {
        name: name.to_string(),
        operation: operation.to_string(),
        queue_depth,
        ops_per_second: latency.count as f64 / elapsed.as_secs_f64(),
        latency,
        fan_out: None,
        sorted_nanos: samples.nanos,
    }
}

/// Runs `order` as page ops at `queue_depth`, writing a fixed pattern or reading; every error
/// is fatal (the bench measures a healthy cluster).
pub fn run_series(
    client: &mut Client,
    order: &[u64],
    queue_depth: usize,
    operation: Operation,
    page_bytes: usize,
) -> Result<(Samples, Duration)> {
    client.set_max_in_flight(queue_depth);
    let mut samples = Samples::with_capacity(order.len());
    let mut buffers = vec![vec![0u8; page_bytes]; CHUNK_OPS.min(order.len())];
    for (index, buffer) in buffers.iter_mut().enumerate() {
        remem_local::pattern::fill(buffer, index as u64, 0, 42);
    }
    let mut elapsed = Duration::ZERO;
    for chunk in order.chunks(CHUNK_OPS) {
        elapsed += run_chunk(client, chunk, operation, &mut buffers, &mut samples)?;
    }
    Ok((samples, elapsed))
}

/// Runs `pages` (at most `buffers.len()`) as one batch at the client's current in-flight limit,
/// writing `buffers` or reading into them; adds each op's latency to `samples` and returns the
/// batch's wall time.
pub(crate) fn run_chunk(
    client: &mut Client,
    pages: &[u64],
    operation: Operation,
    buffers: &mut [Vec<u8>],
    samples: &mut Samples,
) -> Result<Duration> {
    assert!(pages.len() <= buffers.len(), "one buffer per op of the batch");
    let mut ops: Vec<PageOp<'_>> = match operation {
        Operation::Write => {
            pages.iter().zip(buffers.iter()).map(|(&page, data)| PageOp::Write { page, data }).collect()
        }
        Operation::Read => {
            pages.iter().zip(buffers.iter_mut()).map(|(&page, buf)| PageOp::Read { page, buf }).collect()
        }
    };
    let mut first_error = None;
    let started = Instant::now();
    client.execute(&mut ops, |done| {
        samples.push(done.latency);
        if let Err(error) = done.result {
            first_error.get_or_insert(error);
        }
    });
    let elapsed = started.elapsed();
    match first_error {
        Some(error) => Err(error).context("page operation failed during the bench"),
        None => Ok(elapsed),
    }
}
