//! `remem demo`: the whole system in one command. Starts a local cluster, writes an address
//! space of pages with EC(8,2), reads every page back and checks every byte, prints latencies
//! and the memory the nodes hold for the data, and stops the cluster.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::code_args::CodeArgs;
use crate::placement_arg::PlacementArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use remem_client::{Client, ClientConfig, PageOp, Shape};

use crate::launcher::{ClusterOptions, LocalCluster};
use crate::stats::Samples;
use crate::units::format_bytes;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Data to write and verify.
    #[arg(long, default_value = "1GiB", value_parser = crate::units::parse_positive_bytes)]
    pub size: u64,
    /// Memory nodes to start (at least k+r).
    #[arg(long, default_value_t = 10, value_parser = crate::units::parse_count)]
    pub nodes: usize,
    #[command(flatten)]
    pub code: CodeArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// Slab size of the nodes.
    #[arg(long, default_value = "64MiB", value_parser = crate::units::parse_positive_bytes)]
    pub slab_size: u64,
    /// Pages in flight.
    #[arg(long, default_value_t = 32, value_parser = crate::units::parse_count)]
    pub queue_depth: usize,
    /// Where the cluster's files and node logs go (default: a fresh temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run even when the nodes would need more memory than the host has available.
    #[arg(long)]
    pub force: bool,
}

const CHUNK_PAGES: usize = 4096;

/// `--slab-size` and `--size` in whole pages, and the node memory `--size` needs within what
/// this host has (unless `--force`).
fn check_sizes(args: &DemoArgs, shape: Shape) -> Result<()> {
    if args.slab_size < 4096 || !args.slab_size.is_multiple_of(4096) {
        bail!("--slab-size {} must be a multiple of 4 KiB", args.slab_size);
    }
    if !args.size.is_multiple_of(4096) {
        bail!("--size {} must be a multiple of 4 KiB (the demo writes whole pages)", args.size);
    }
    let node_bytes = remem_client::region_node_bytes(shape, args.size, args.slab_size, 4096);
    if let Some(available) = crate::launcher::host_available_bytes() {
        if node_bytes > available / 10 * 8 && !args.force {
            bail!(
                "--size {} and this host has {} available: use a smaller --size, or --force",
                remem_client::NodeMemoryNeed::new(shape, args.size, node_bytes),
                format_bytes(available)
            );
        }
    }
    Ok(())
}

pub fn run(args: DemoArgs, binary: &std::path::Path) -> Result<()> {
    let shape = args.code.shape()?;
    if args.nodes < shape.total_splits() {
        bail!("--nodes {} is fewer than k+r = {}", args.nodes, shape.total_splits());
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("remem-demo-{}", std::process::id())));
    check_sizes(&args, shape)?;
    let split_bytes = 4096 / args.code.data_splits as u64;
    let slabs_needed = args.size.div_ceil(args.slab_size / split_bytes * 4096) * shape.total_splits() as u64;
    let per_node = slabs_needed.div_ceil(args.nodes as u64) + 2;
    let options = ClusterOptions {
        lease_grace: None,
        nodes: args.nodes,
        capacity_bytes: per_node * args.slab_size * 102 / 100,
        slab_size_bytes: args.slab_size,
        nodes_per_domain: 1,
        dir: dir.clone(),
        fault_injection: false,
        // `None` is `--no-monitor`; a forced demo forces its nodes past their host check too.
        monitor_args: args.force.then(|| vec!["--no-monitor".to_owned(), "--force".to_owned()]),
        unix_sockets: crate::launcher::UnixSockets::All,
        encrypt: false,
    };
    println!("starting {} memory nodes (logs in {}) ...", args.nodes, dir.display());
    let mut cluster = LocalCluster::start(binary, &options)?;
    let mut config = ClientConfig::new(shape, args.size);
    config.allow_shared_domains = args.placement.allow_shared_domains;
    config.max_in_flight = args.queue_depth.max(1);
    let mut client = Client::connect(&cluster.addresses(), &cluster.secret, config, args.placement.build(7))
        .context("connecting to the cluster")?;
    let pages = client.page_count();
    println!(
        "EC({},{}) delta={}: {} pages of 4 KiB = {} over {} ranges of {} slabs",
        args.code.data_splits,
        args.code.parity_splits,
        args.code.delta,
        pages,
        format_bytes(args.size),
        client.ranges().len(),
        shape.total_splits()
    );

    let seed = 0x5eed;
    let write = pass(&mut client, pages, Pass::Write, seed)?;
    let read = pass(&mut client, pages, Pass::Read, seed)?;
    cluster.check_alive()?;
    let memory = client.memory_report();

    println!();
    println!(
        "{:<8} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "op", "p50 us", "p99 us", "p99.9 us", "MiB/s", "pages"
    );
    for (name, mut samples, elapsed) in [("write", write.0, write.1), ("read", read.0, read.1)] {
        let summary = samples.summarize();
        let mib_per_second = summary.count as f64 * 4096.0 / elapsed.as_secs_f64() / (1 << 20) as f64;
        println!(
            "{name:<8} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>12}",
            summary.p50_us, summary.p99_us, summary.p999_us, mib_per_second, summary.count
        );
    }
    let node_bytes = memory.slab_bytes + memory.metadata_bytes;
    println!();
    println!(
        "every one of {pages} pages read back and verified: 0 mismatches (queue depth {})",
        args.queue_depth
    );
    println!(
        "node memory: {} slabs + {} metadata for {} of data = {:.4}x (EC({},{}) ideal {:.4}x; metadata {:.3}% of slab memory)",
        format_bytes(memory.slab_bytes),
        format_bytes(memory.metadata_bytes),
        format_bytes(memory.address_space_bytes),
        node_bytes as f64 / memory.address_space_bytes as f64,
        args.code.data_splits,
        args.code.parity_splits,
        shape.total_splits() as f64 / args.code.data_splits as f64,
        memory.metadata_bytes as f64 * 100.0 / memory.slab_bytes.max(1) as f64,
    );
    client.release().context("releasing slabs")?;
    drop(client);
    cluster.stop(Duration::from_secs(3));
    drop(cluster);
    if args.dir.is_none() {
        // A run that succeeded leaves nothing behind (its secret included); a failed one keeps
        // its directory for the node logs.
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        println!("cluster stopped, {} removed", dir.display());
    } else {
        println!("cluster stopped (its files stay in {})", dir.display());
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Write,
    Read,
}

/// Writes or reads-and-verifies every page, with progress on stderr once a second.
fn pass(client: &mut Client, pages: u64, which: Pass, seed: u64) -> Result<(Samples, Duration)> {
    let name = if which == Pass::Write { "writing" } else { "reading and verifying" };
    let mut samples = Samples::with_capacity(pages as usize);
    let mut buffers = vec![vec![0u8; 4096]; CHUNK_PAGES];
    let mut scratch = vec![0u8; 4096];
    let started = Instant::now();
    let mut last_report = started;
    let mut done_pages = 0u64;
    let mut first = 0u64;
    while first < pages {
        let count = (pages - first).min(CHUNK_PAGES as u64) as usize;
        if which == Pass::Write {
            for (offset, buffer) in buffers[..count].iter_mut().enumerate() {
                crate::pattern::fill(buffer, first + offset as u64, 1, seed);
            }
        }
        let mut failure = None;
        {
            let mut ops: Vec<PageOp<'_>> = match which {
                Pass::Write => buffers[..count]
                    .iter()
                    .enumerate()
                    .map(|(offset, data)| PageOp::Write { page: first + offset as u64, data })
                    .collect(),
                Pass::Read => buffers[..count]
                    .iter_mut()
                    .enumerate()
                    .map(|(offset, buf)| PageOp::Read { page: first + offset as u64, buf })
                    .collect(),
            };
            client.execute(&mut ops, |done| {
                samples.push(done.latency);
                if let Err(error) = done.result {
                    failure.get_or_insert(error);
                }
            });
        }
        if let Some(error) = failure {
            return Err(error).context(format!("{name} page failed"));
        }
        if which == Pass::Read {
            for (offset, buffer) in buffers[..count].iter().enumerate() {
                let page = first + offset as u64;
                if !crate::pattern::check(buffer, page, 1, seed, &mut scratch) {
                    bail!("page {page} read back WRONG: this is a bug, please report it");
                }
            }
        }
        first += count as u64;
        done_pages += count as u64;
        if last_report.elapsed() >= Duration::from_secs(1) || first == pages {
            last_report = Instant::now();
            eprintln!(
                "{name}: {done_pages}/{pages} pages ({:.0}%), {:.1} s",
                done_pages as f64 * 100.0 / pages as f64,
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok((samples, started.elapsed()))
}
