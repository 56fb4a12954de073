//! `remem bench regen`: rebuild one slab of a full EC(8,2) range and time it, with reads served
//! and checked throughout, and a progress bar from the nodes' own counters.
//!
//! The cluster has k+r+1 nodes so the rebuilt slab has somewhere to go. The slab is evicted by
//! command (the same path as an eviction under memory pressure); the client treats it as lost,
//! maps an empty slab on the spare node and hands it the rebuild. MiB/s is the slab's size over
//! the time from the eviction to the node's `RegenerationDone`.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem_client::{Client, ClientConfig, PageOp, Shape};
use remem_placement::LeastLoaded;
use serde::Serialize;

use remem_local::launcher::{ClusterOptions, LocalCluster};
use remem_local::stats::{Samples, Summary};
use remem_local::units::{format_bytes, parse_bytes};
use remem_node::FloorSource;

#[derive(Args, Debug)]
pub struct RegenArgs {
    /// Slab size: the range holds k x this much data, all written before the rebuild.
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    pub slab_size: u64,
    /// Single-page reads and writes per second served before and during the rebuild (half
    /// each), whose latencies are reported.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub ops_per_second: u32,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct RegenReport {
    pub slab_bytes: u64,
    pub seconds: f64,
    pub mib_per_second: f64,
    /// The fastest of two floor reads (before the rebuild and after it): seconds to read the k
    /// source slabs in the rebuild's batches and pipeline depth, without judging or decoding.
    pub floor_seconds: f64,
    pub floor_runs: Vec<f64>,
    pub floor_mib_per_second: f64,
    /// Rebuild speed over floor speed (1.0: the rebuild is as fast as reading its sources).
    pub rebuild_over_floor: f64,
    pub ops_per_second: u32,
    /// Single-page read and write latencies served before the rebuild and during it.
    pub before: ServedSummary,
    pub during: ServedSummary,
    pub reads_during_rebuild: u64,
    pub read_mismatches: u64,
    pub pages_verified_after: u64,
    /// Where the CPU went during the fastest floor read and during the rebuild.
    pub floor_cpu: PhaseCpu,
    pub rebuild_cpu: PhaseCpu,
}

/// CPU seconds spent during one phase (from /proc: 10 ms ticks), by whom.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PhaseCpu {
    pub wall_seconds: f64,
    /// Every CPU of the machine, busy (user, system, interrupts, steal).
    pub machine_busy_seconds: f64,
    pub cpus: usize,
    /// The k nodes holding the source slabs.
    pub source_nodes_seconds: f64,
    /// The node the slab was rebuilt on (idle during the floor).
    pub rebuilding_node_seconds: f64,
    /// This process: the client serving the paced ops, and during the floor the floor reader.
    pub bench_seconds: f64,
}

/// CPU seconds used so far by the machine, each node and this process.
struct CpuSnapshot {
    at: Instant,
    machine: f64,
    cpus: usize,
    nodes: Vec<f64>,
    bench: f64,
}

impl CpuSnapshot {
    fn take(cluster: &LocalCluster, nodes: usize) -> Result<CpuSnapshot> {
        let (machine, cpus) = remem_local::stats::machine_busy_seconds()?;
        let nodes = (0..nodes)
            .map(|node| cluster.pid(node).map_or(Ok(0.0), remem_local::stats::cpu_seconds))
            .collect::<Result<Vec<f64>>>()?;
        let bench = remem_local::stats::cpu_seconds(std::process::id())?;
        Ok(CpuSnapshot { at: Instant::now(), machine, cpus, nodes, bench })
    }

    /// What was spent from `self` to `later`, the sources being nodes `sources` and the
    /// rebuilding node `rebuilder`.
    fn until(&self, later: &CpuSnapshot, sources: &[usize], rebuilder: usize) -> PhaseCpu {
        let node = |index: usize| later.nodes[index] - self.nodes[index];
        PhaseCpu {
            wall_seconds: (later.at - self.at).as_secs_f64(),
            machine_busy_seconds: later.machine - self.machine,
            cpus: later.cpus,
            source_nodes_seconds: sources.iter().map(|&index| node(index)).sum(),
            rebuilding_node_seconds: node(rebuilder),
            bench_seconds: later.bench - self.bench,
        }
    }
}

const SEED: u64 = 0x4e6e;

/// Writes the pattern of every page of the range, showing progress.
fn fill_range(client: &mut Client, buffers: &mut [Vec<u8>], pages: u64) -> Result<()> {
    let started = Instant::now();
    for first in (0..pages).step_by(buffers.len()) {
        let count = (pages - first).min(buffers.len() as u64) as usize;
        for (offset, buffer) in buffers[..count].iter_mut().enumerate() {
            remem_local::pattern::fill(buffer, first + offset as u64, 1, SEED);
        }
        let mut ops: Vec<PageOp<'_>> = buffers[..count]
            .iter()
            .enumerate()
            .map(|(offset, data)| PageOp::Write { page: first + offset as u64, data })
            .collect();
        client.execute_all(&mut ops).context("filling the range")?;
        progress("writing", first + count as u64, pages, started);
    }
    eprintln!();
    Ok(())
}

/// Serves reads and writes at the work's rate (each read checked) until the client's rebuild is
/// done, showing the nodes' progress; at most 10 minutes.
fn serve_until_rebuilt(client: &mut Client, work: &mut Work<'_>, evicted: Instant) -> Result<Served> {
    let mut during = Served::default();
    let mut last_progress = Instant::now();
    loop {
        // A read and a write each round, so even a rebuild over in a moment has both timed.
        during.one_op(client, work)?;
        during.one_op(client, work)?;
        if during.ops.is_multiple_of(16) {
            client.poll_background(Duration::ZERO);
        }
        let status = client.regeneration_status();
        if status.in_flight == 0 && status.done > 0 {
            break;
        }
        if last_progress.elapsed() > Duration::from_millis(250) {
            last_progress = Instant::now();
            let (done, total) = node_progress(client);
            if total > 0 {
                progress("rebuilding", done, total, evicted);
            }
        }
        if evicted.elapsed() > Duration::from_secs(600) {
            bail!("the rebuild did not finish in 10 minutes");
        }
    }
    Ok(during)
}

/// Reads every page back and checks it: (pages read, pages with other bytes).
fn verify_every_page(client: &mut Client, buffers: &mut [Vec<u8>], pages: u64) -> Result<(u64, u64)> {
    let mut scratch = vec![0u8; 4096];
    let mut mismatches = 0u64;
    let mut verified = 0u64;
    for first in (0..pages).step_by(buffers.len()) {
        let count = (pages - first).min(buffers.len() as u64) as usize;
        let mut ops: Vec<PageOp<'_>> = buffers[..count]
            .iter_mut()
            .enumerate()
            .map(|(offset, buf)| PageOp::Read { page: first + offset as u64, buf })
            .collect();
        client.execute_all(&mut ops).context("reading after the rebuild")?;
        for (offset, buffer) in buffers[..count].iter().enumerate() {
            verified += 1;
            if !remem_local::pattern::check(buffer, first + offset as u64, 1, SEED, &mut scratch) {
                mismatches += 1;
            }
        }
    }
    Ok((verified, mismatches))
}

/// k+r+1 nodes with room for 3 slabs each, and a client of one range on them.
fn regen_cluster(args: &RegenArgs, binary: &std::path::Path, shape: Shape) -> Result<(LocalCluster, Client)> {
    let dir = std::env::temp_dir().join(format!("remem-regen-{}", std::process::id()));
    let options = ClusterOptions {
        lease_grace: None,
        nodes: shape.total_splits() + 1,
        capacity_bytes: 3 * args.slab_size,
        slab_size_bytes: args.slab_size,
        nodes_per_domain: 1,
        dir,
        fault_injection: true,
        monitor_args: None,
        unix_sockets: remem_local::launcher::UnixSockets::All,
        encrypt: false,
    };
    eprintln!("starting {} nodes with {} slabs ...", options.nodes, format_bytes(args.slab_size));
    let cluster = LocalCluster::start(binary, &options)?;
    let data_bytes = args.slab_size / 512 * 4096;
    let mut config = ClientConfig::new(shape, data_bytes);
    config.request_timeout = Duration::from_secs(10);
    let client = Client::connect(
        &cluster.addresses(),
        &cluster.secret,
        config,
        Box::new(LeastLoaded::new(StdRng::seed_from_u64(SEED))),
    )
    .context("connecting")?;
    Ok((cluster, client))
}

pub fn run(args: RegenArgs, binary: &std::path::Path) -> Result<RegenReport> {
    let shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
    let (cluster, mut client) = regen_cluster(&args, binary, shape)?;
    let pages = client.page_count();
    eprintln!("writing {} ({pages} pages) ...", format_bytes(pages * 4096));
    let mut buffers = vec![vec![0u8; 4096]; 1024];
    fill_range(&mut client, &mut buffers, pages)?;

    let rate = args.ops_per_second;
    let (op_buffer, rest) = buffers.split_first_mut().expect("buffers");
    let mut work =
        Work { rng: StdRng::seed_from_u64(SEED), pages, buffer: op_buffer, scratch: &mut rest[0], rate };
    eprintln!("serving {rate} single-page reads and writes per second for 2 s (before) ...");
    let mut before = Served::default();
    let serving = Instant::now();
    while serving.elapsed() < Duration::from_secs(2) {
        before.one_op(&mut client, &mut work)?;
    }

    // The floor: the k sources the rebuild will read, read the same way and dropped.
    let k = shape.data_splits;
    let slabs = client.ranges()[0].slabs.clone();
    let floor_sources: Vec<FloorSource> = slabs[1..]
        .iter()
        .enumerate()
        .map(|(offset, slab)| FloorSource {
            split_index: offset as u8 + 1,
            slab_id: slab.slab_id,
            address: cluster.file.nodes[slab.node].address,
        })
        .collect();
    let slots = u32::try_from(pages).context("too many pages for one slab")?;
    let split_bytes = (4096 / k) as u32;
    let mut floors = Vec::new();
    eprintln!("floor: reading the {k} source slabs in the rebuild's batches, without decoding ...");
    let mut floor_load = [Served::default(), Served::default()];
    let node_count = shape.total_splits() + 1;
    let mut floor_snapshots = Vec::new();
    let shape_of_floor = (k, slots, split_bytes);
    let mut measure_floor = |client: &mut Client, served: &mut Served, work: &mut Work<'_>| -> Result<()> {
        let before = CpuSnapshot::take(&cluster, node_count)?;
        floors.push(floor(&cluster, client, served, work, &floor_sources, shape_of_floor)?);
        floor_snapshots.push((before, CpuSnapshot::take(&cluster, node_count)?));
        Ok(())
    };
    measure_floor(&mut client, &mut floor_load[0], &mut work)?;

    let victim = slabs[0];
    let address = cluster.file.nodes[victim.node].address;
    eprintln!("evicting slab {} of split 0 on {address} ...", victim.slab_id);
    let before_rebuild = CpuSnapshot::take(&cluster, node_count)?;
    let evicted = Instant::now();
    remem_local::faults::inject(
        address,
        &cluster.secret,
        client.client_id(),
        remem_local::faults::Fault::Evict { slab_id: victim.slab_id },
    )?;
    let mut during = serve_until_rebuilt(&mut client, &mut work, evicted)?;
    let seconds = evicted.elapsed().as_secs_f64();
    let after_rebuild = CpuSnapshot::take(&cluster, node_count)?;
    progress("rebuilding", 1, 1, evicted);
    eprintln!();
    if client.ranges()[0].slabs[0].node == victim.node {
        bail!("split 0 still points at the evicting node after the rebuild");
    }
    eprintln!("floor again, after the rebuild ...");
    measure_floor(&mut client, &mut floor_load[1], &mut work)?;
    let floor_seconds = floors.iter().copied().fold(f64::INFINITY, f64::min);
    let source_nodes: Vec<usize> = slabs[1..].iter().map(|slab| slab.node).collect();
    let rebuilder = client.ranges()[0].slabs[0].node;
    let fastest = if floors[0] <= floors[1] { 0 } else { 1 };
    let floor_cpu = floor_snapshots[fastest].0.until(&floor_snapshots[fastest].1, &source_nodes, rebuilder);
    let rebuild_cpu = before_rebuild.until(&after_rebuild, &source_nodes, rebuilder);
    let load_mismatches: u64 = floor_load.iter().map(|served| served.mismatches).sum();
    let mut mismatches = before.mismatches + during.mismatches + load_mismatches;

    // Full redundancy is back: lose two other slabs and check every page.
    let others: Vec<usize> = client.ranges()[0].slabs[1..3].iter().map(|slab| slab.node).collect();
    let mut cluster = cluster;
    for node in others {
        cluster.kill(node)?;
    }
    eprintln!("killed the nodes of splits 1 and 2; verifying every page from the rebuilt slab ...");
    let (verified, lost) = verify_every_page(&mut client, &mut buffers, pages)?;
    mismatches += lost;
    // The client first: its slabs are released while the nodes still run.
    drop(client);
    cluster.remove_dir_on_drop();
    drop(cluster);
    let mib = args.slab_size as f64 / (1 << 20) as f64;
    Ok(RegenReport {
        slab_bytes: args.slab_size,
        seconds,
        mib_per_second: mib / seconds,
        floor_seconds,
        floor_runs: floors,
        floor_mib_per_second: mib / floor_seconds,
        rebuild_over_floor: floor_seconds / seconds,
        ops_per_second: rate,
        before: before.summarize(),
        during: during.summarize(),
        reads_during_rebuild: during.reads.nanos.len() as u64,
        read_mismatches: mismatches,
        pages_verified_after: verified,
        floor_cpu,
        rebuild_cpu,
    })
}

/// What a served op needs: the page picker, the range's size, buffers and the rate.
struct Work<'a> {
    rng: StdRng,
    pages: u64,
    buffer: &'a mut [u8],
    scratch: &'a mut [u8],
    rate: u32,
}

/// Single-page ops served at a fixed rate, alternately a read (checked against the pattern) and a
/// write (the same bytes again, at a new version), with their latencies.
#[derive(Default)]
struct Served {
    ops: u64,
    started: Option<Instant>,
    reads: Samples,
    writes: Samples,
    mismatches: u64,
}

impl Served {
    fn one_op(&mut self, client: &mut Client, work: &mut Work<'_>) -> Result<()> {
        let Work { rng, pages, buffer, scratch, rate } = work;
        let (pages, rate) = (*pages, *rate);
        let started = *self.started.get_or_insert_with(Instant::now);
        // Paced, so the load is the same before and during the rebuild whatever its speed.
        let due = started + Duration::from_secs_f64(self.ops as f64 / f64::from(rate.max(1)));
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let page = rng.gen_range(0..pages);
        let op_started = Instant::now();
        if self.ops.is_multiple_of(2) {
            client.execute_all(&mut [PageOp::Read { page, buf: buffer }]).context("a read failed")?;
            self.reads.push(op_started.elapsed());
            if !remem_local::pattern::check(buffer, page, 1, SEED, &mut scratch[..]) {
                self.mismatches += 1;
            }
        } else {
            remem_local::pattern::fill(buffer, page, 1, SEED);
            client.execute_all(&mut [PageOp::Write { page, data: buffer }]).context("a write failed")?;
            self.writes.push(op_started.elapsed());
        }
        self.ops += 1;
        Ok(())
    }

    fn summarize(&mut self) -> ServedSummary {
        ServedSummary { reads: self.reads.summarize(), writes: self.writes.summarize() }
    }
}

#[derive(Debug, Serialize)]
pub struct ServedSummary {
    pub reads: Summary,
    pub writes: Summary,
}

/// Reads the floor on its own thread while this one serves ops at the rebuild's rate, so the
/// floor and the rebuild run under the same load; returns the floor's seconds.
#[allow(clippy::too_many_arguments)]
fn floor(
    cluster: &LocalCluster,
    client: &mut Client,
    served: &mut Served,
    work: &mut Work<'_>,
    sources: &[FloorSource],
    (k, slots, split_bytes): (usize, u32, u32),
) -> Result<f64> {
    let (secret, client_id, sources) = (cluster.secret.clone(), client.client_id(), sources.to_vec());
    let reader = std::thread::Builder::new()
        .name("remem-floor".to_owned())
        .spawn(move || remem_node::read_floor(&secret, client_id, &sources, k, slots, split_bytes))
        .context("starting the floor reader")?;
    while !reader.is_finished() {
        served.one_op(client, work)?;
    }
    let elapsed = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the floor reader panicked"))?
        .map_err(|error| anyhow::anyhow!("the floor read failed: {error}"))?;
    Ok(elapsed.as_secs_f64())
}

fn node_progress(client: &mut Client) -> (u64, u64) {
    client.node_infos().into_iter().filter_map(|(_, info)| info.ok()).fold((0, 0), |(done, total), info| {
        (done + info.regeneration_pages_done, total + info.regeneration_pages_total)
    })
}

fn progress(what: &str, done: u64, total: u64, started: Instant) {
    let fraction = (done as f64 / total.max(1) as f64).min(1.0);
    let filled = (fraction * 40.0) as usize;
    let elapsed = started.elapsed().as_secs_f64();
    let eta = if fraction > 0.0 && fraction < 1.0 {
        format!(" ETA {:.1} s", elapsed * (1.0 - fraction) / fraction)
    } else {
        String::new()
    };
    eprint!(
        "\r{what:<11} [{}{}] {:>5.1}% {elapsed:>6.1} s{eta:<14}",
        "#".repeat(filled),
        ".".repeat(40 - filled),
        fraction * 100.0,
    );
    let _ = std::io::stderr().flush();
}

pub fn print(report: &RegenReport) {
    println!(
        "rebuilt a {} slab in {:.2} s: {:.1} MiB/s",
        format_bytes(report.slab_bytes),
        report.seconds,
        report.mib_per_second
    );
    println!(
        "floor (the k source slabs read in the same batches and depth, no decoding): {:.2} s, {:.1} MiB/s of slab",
        report.floor_seconds, report.floor_mib_per_second
    );
    println!("rebuild speed / floor speed: {:.2} (target >= 0.70)", report.rebuild_over_floor);
    let (floor, rebuild) = (&report.floor_cpu, &report.rebuild_cpu);
    println!("CPU seconds (from /proc, 10 ms ticks)       floor  rebuild");
    for (label, floor_value, rebuild_value) in [
        ("wall clock", floor.wall_seconds, rebuild.wall_seconds),
        ("machine busy", floor.machine_busy_seconds, rebuild.machine_busy_seconds),
        ("the k source nodes", floor.source_nodes_seconds, rebuild.source_nodes_seconds),
        ("the rebuilding node", floor.rebuilding_node_seconds, rebuild.rebuilding_node_seconds),
        ("this process (client; floor reader)", floor.bench_seconds, rebuild.bench_seconds),
    ] {
        println!("  {label:<40} {floor_value:>6.2} {rebuild_value:>8.2}");
    }
    let busy = |phase: &PhaseCpu| phase.machine_busy_seconds / phase.wall_seconds.max(1e-9);
    println!(
        "  cores busy of {}: floor {:.2}, rebuild {:.2}; machine CPU floor / rebuild: {:.2}",
        rebuild.cpus,
        busy(floor),
        busy(rebuild),
        floor.machine_busy_seconds / rebuild.machine_busy_seconds.max(1e-9)
    );
    println!("served at {} single-page ops/s, latency in us:", report.ops_per_second);
    println!("  {:<16} {:>8} {:>8} {:>8}", "", "ops", "p50", "p99");
    for (label, summary) in [
        ("reads before", &report.before.reads),
        ("reads during", &report.during.reads),
        ("writes before", &report.before.writes),
        ("writes during", &report.during.writes),
    ] {
        println!("  {label:<16} {:>8} {:>8.1} {:>8.1}", summary.count, summary.p50_us, summary.p99_us);
    }
    println!(
        "{} reads checked during the rebuild, {} pages verified after losing two more slabs, {} mismatches",
        report.reads_during_rebuild, report.pages_verified_after, report.read_mismatches
    );
}
