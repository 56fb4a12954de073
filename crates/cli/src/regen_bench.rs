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

use crate::launcher::{ClusterOptions, LocalCluster};
use crate::units::{format_bytes, parse_bytes};

#[derive(Args, Debug)]
pub struct RegenArgs {
    /// Slab size: the range holds k x this much data, all written before the rebuild.
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    pub slab_size: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct RegenReport {
    pub slab_bytes: u64,
    pub seconds: f64,
    pub mib_per_second: f64,
    pub reads_during_rebuild: u64,
    pub read_mismatches: u64,
    pub pages_verified_after: u64,
}

const SEED: u64 = 0x4e6e;

pub fn run(args: RegenArgs, binary: &std::path::Path) -> Result<RegenReport> {
    let shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
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
        unix_sockets: crate::launcher::UnixSockets::All,
    };
    eprintln!("starting {} nodes with {} slabs ...", options.nodes, format_bytes(args.slab_size));
    let cluster = LocalCluster::start(binary, &options)?;
    let data_bytes = args.slab_size / 512 * 4096;
    let mut config = ClientConfig::new(shape, data_bytes);
    config.request_timeout = Duration::from_secs(10);
    let mut client = Client::connect(
        &cluster.addresses(),
        &cluster.secret,
        config,
        Box::new(LeastLoaded::new(StdRng::seed_from_u64(SEED))),
    )
    .context("connecting")?;
    let pages = client.page_count();
    eprintln!("writing {} ({pages} pages) ...", format_bytes(data_bytes));
    let mut buffers = vec![vec![0u8; 4096]; 1024];
    let started = Instant::now();
    for first in (0..pages).step_by(buffers.len()) {
        let count = (pages - first).min(buffers.len() as u64) as usize;
        for (offset, buffer) in buffers[..count].iter_mut().enumerate() {
            crate::pattern::fill(buffer, first + offset as u64, 1, SEED);
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

    let victim = client.ranges()[0].slabs[0];
    let address = cluster.file.nodes[victim.node].address;
    eprintln!("evicting slab {} of split 0 on {address} ...", victim.slab_id);
    let evicted = Instant::now();
    crate::faults::inject(
        address,
        &cluster.secret,
        client.client_id(),
        crate::faults::Fault::Evict { slab_id: victim.slab_id },
    )?;
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut reads = 0u64;
    let mut mismatches = 0u64;
    let mut scratch = vec![0u8; 4096];
    let mut last_progress = Instant::now();
    // Reads go on while the slab is rebuilt: 64 random pages per round, each checked.
    loop {
        let batch: Vec<u64> = (0..64).map(|_| rng.gen_range(0..pages)).collect();
        let mut ops: Vec<PageOp<'_>> =
            batch.iter().zip(buffers.iter_mut()).map(|(&page, buf)| PageOp::Read { page, buf }).collect();
        client.execute_all(&mut ops).context("a read during the rebuild failed")?;
        for (page, buffer) in batch.iter().zip(&buffers) {
            reads += 1;
            if !crate::pattern::check(buffer, *page, 1, SEED, &mut scratch) {
                mismatches += 1;
            }
        }
        client.poll_background(Duration::from_millis(1));
        let status = client.regeneration_status();
        if status.in_flight == 0 && status.done > 0 {
            break;
        }
        if last_progress.elapsed() > Duration::from_millis(250) {
            last_progress = Instant::now();
            let (done, total) = node_progress(&mut client);
            if total > 0 {
                progress("rebuilding", done, total, evicted);
            }
        }
        if evicted.elapsed() > Duration::from_secs(600) {
            bail!("the rebuild did not finish in 10 minutes");
        }
    }
    let seconds = evicted.elapsed().as_secs_f64();
    progress("rebuilding", 1, 1, evicted);
    eprintln!();
    if client.ranges()[0].slabs[0].node == victim.node {
        bail!("split 0 still points at the evicting node after the rebuild");
    }

    // Full redundancy is back: lose two other slabs and check every page.
    let others: Vec<usize> = client.ranges()[0].slabs[1..3].iter().map(|slab| slab.node).collect();
    let mut cluster = cluster;
    for node in others {
        cluster.kill(node)?;
    }
    eprintln!("killed the nodes of splits 1 and 2; verifying every page from the rebuilt slab ...");
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
            if !crate::pattern::check(buffer, first + offset as u64, 1, SEED, &mut scratch) {
                mismatches += 1;
            }
        }
    }
    // The client first: its slabs are released while the nodes still run.
    drop(client);
    drop(cluster);
    Ok(RegenReport {
        slab_bytes: args.slab_size,
        seconds,
        mib_per_second: args.slab_size as f64 / (1 << 20) as f64 / seconds,
        reads_during_rebuild: reads,
        read_mismatches: mismatches,
        pages_verified_after: verified,
    })
}

fn node_progress(client: &mut Client) -> (u64, u64) {
    client.node_infos().into_iter().filter_map(|(_, info)| info.ok()).fold((0, 0), |(done, total), info| {
        (done + info.regeneration_pages_done, total + info.regeneration_pages_total)
    })
}

fn progress(what: &str, done: u64, total: u64, started: Instant) {
    let fraction = done as f64 / total.max(1) as f64;
    let filled = (fraction * 40.0) as usize;
    eprint!(
        "\r{what:<11} [{}{}] {:>5.1}% {:>6.1} s",
        "#".repeat(filled),
        ".".repeat(40 - filled),
        fraction * 100.0,
        started.elapsed().as_secs_f64()
    );
    let _ = std::io::stderr().flush();
}

pub fn print(report: &RegenReport) {
    println!(
        "rebuilt a {} slab in {:.2} s: {:.1} MiB/s; {} reads served and checked during the rebuild, {} pages verified after losing two more slabs, {} mismatches",
        format_bytes(report.slab_bytes),
        report.seconds,
        report.mib_per_second,
        report.reads_during_rebuild,
        report.pages_verified_after,
        report.read_mismatches
    );
}
