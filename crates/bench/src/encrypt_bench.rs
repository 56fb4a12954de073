//! `remem bench pages --encryption`: what encrypting node traffic costs (`--encrypt`,
//! docs/SECURITY.md). Two clusters of `--nodes` TCP-only nodes on this host, one plaintext and
//! one with `--encrypt`, each with an EC(8,2) delta-1 client; page reads and writes at queue
//! depth 1 run interleaved, 64 ops on one then the same 64 pages on the other, so the noise of
//! these 2-core machines hits both alike, and the report is the encrypted p50 over the
//! plaintext p50 of the same run. Every page is read back and checked on both at the end.
//!
//! Two clusters because a node with `--encrypt` refuses plaintext: one node set cannot serve
//! both. They hold the same number of nodes on the same host, so each series pays the same
//! scheduling; the clients run one after the other, never at once.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use remem_client::{Client, ClientConfig, Shape};
use remem_local::launcher::{ClusterOptions, LocalCluster, UnixSockets};
use remem_local::stats::{Samples, Summary};
use serde::Serialize;

use crate::bench::{run_chunk, run_series, BenchArgs, Operation, CHUNK_OPS};

const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
/// Ops per turn of each client in the interleaved series: about 15 ms at queue depth 1, short
/// enough that a burst of other work on the host lands on both sides alike.
const INTERLEAVE_OPS: usize = 64;
/// The pattern seed of the pages the fill writes (`run_series`: page `p` holds the pattern of
/// index `p % CHUNK_OPS`, generation 0).
const FILL_SEED: u64 = 42;

/// One operation, plaintext beside encrypted.
#[derive(Debug, Serialize)]
pub struct EncryptionRow {
    pub operation: String,
    pub plaintext: Summary,
    pub encrypted: Summary,
    /// Encrypted p50 over plaintext p50.
    pub p50_ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct EncryptionCost {
    pub nodes: usize,
    pub scheme: String,
    pub queue_depth: usize,
    pub rows: Vec<EncryptionRow>,
    /// Pages read back and checked on each cluster at the end.
    pub pages_verified: u64,
}

/// Runs the comparison on two scratch clusters the bench starts (`--cluster` is refused: one
/// cluster cannot be both).
pub fn run(args: &BenchArgs, binary: &Path) -> Result<EncryptionCost> {
    ensure!(args.cluster.is_none(), "--encryption starts its own two clusters; leave out --cluster");
    let mut clusters = Vec::new();
    let mut clients = Vec::new();
    for encrypt in [false, true] {
        let name = if encrypt { "encrypted" } else { "plaintext" };
        let options = ClusterOptions {
            lease_grace: None,
            nodes: args.nodes,
            capacity_bytes: 64 * args.slab_size.max(1 << 20),
            slab_size_bytes: args.slab_size,
            nodes_per_domain: 1,
            dir: std::env::temp_dir().join(format!("remem-bench-{name}-{}", std::process::id())),
            fault_injection: false,
            monitor_args: None,
            unix_sockets: UnixSockets::None,
            encrypt,
        };
        eprintln!("starting {} {name} nodes ...", options.nodes);
        let cluster = LocalCluster::start(binary, &options)?;
        let mut config = ClientConfig::new(EC82, args.size);
        config.allow_shared_domains = args.placement.allow_shared_domains;
        config.spin_before_block = std::time::Duration::from_micros(args.spin_us);
        config.encrypt = encrypt;
        let mut client =
            Client::connect(&cluster.addresses(), &cluster.secret, config, args.placement.build(args.seed))
                .with_context(|| format!("connecting the {name} client"))?;
        eprintln!("{name}: filling {} ...", remem_local::units::format_bytes(args.size));
        let fill_order: Vec<u64> = (0..client.page_count()).collect();
        run_series(&mut client, &fill_order, 32, Operation::Write, 4096)?;
        clusters.push(cluster);
        clients.push(client);
    }
    let [plaintext, encrypted] = &mut clients[..] else { unreachable!("two clients") };
    let pages = plaintext.page_count();
    let mut rng = StdRng::seed_from_u64(args.seed);
    let order = crate::bench::random_pages(&mut rng, pages, args.ops);
    let mut rows = Vec::new();
    for operation in [Operation::Read, Operation::Write] {
        eprintln!(
            "ec(8,2) d=1 {} qd1 x{}, plaintext and encrypted interleaved ...",
            operation.name(),
            args.ops
        );
        let (mut plain, mut sealed) = interleaved(plaintext, encrypted, &order, operation)?;
        let (plaintext, encrypted) = (plain.summarize(), sealed.summarize());
        rows.push(EncryptionRow {
            operation: operation.name().to_owned(),
            p50_ratio: encrypted.p50_us / plaintext.p50_us,
            plaintext,
            encrypted,
        });
    }
    // The measured writes wrote the fill's patterns again (`run_series` fills its buffers the
    // same way), so every page still holds what the fill wrote.
    let pages_verified = verify(plaintext, pages)? + verify(encrypted, pages)?;
    for client in &mut clients {
        client.release().context("releasing slabs")?;
    }
    drop(clients);
    for cluster in &mut clusters {
        cluster.remove_dir_on_drop();
    }
    Ok(EncryptionCost {
        nodes: args.nodes,
        scheme: "ec(8,2) d=1".to_owned(),
        queue_depth: 1,
        rows,
        pages_verified,
    })
}

/// `order` at queue depth 1 on both clients, a chunk on one then the same chunk on the other.
fn interleaved(
    plaintext: &mut Client,
    encrypted: &mut Client,
    order: &[u64],
    operation: Operation,
) -> Result<(Samples, Samples)> {
    let mut samples = (Samples::with_capacity(order.len()), Samples::with_capacity(order.len()));
    let mut buffers = vec![vec![0u8; 4096]; INTERLEAVE_OPS.min(order.len())];
    plaintext.set_max_in_flight(1);
    encrypted.set_max_in_flight(1);
    for chunk in order.chunks(INTERLEAVE_OPS) {
        // Written pages get their fill pattern again: `verify` checks it.
        if operation == Operation::Write {
            for (buffer, &page) in buffers.iter_mut().zip(chunk) {
                remem_local::pattern::fill(buffer, page % CHUNK_OPS as u64, 0, FILL_SEED);
            }
        }
        run_chunk(plaintext, chunk, operation, &mut buffers, &mut samples.0)?;
        if operation == Operation::Write {
            for (buffer, &page) in buffers.iter_mut().zip(chunk) {
                remem_local::pattern::fill(buffer, page % CHUNK_OPS as u64, 0, FILL_SEED);
            }
        }
        run_chunk(encrypted, chunk, operation, &mut buffers, &mut samples.1)?;
    }
    Ok(samples)
}

/// Reads every page and checks it holds the fill's pattern; returns the pages checked.
fn verify(client: &mut Client, pages: u64) -> Result<u64> {
    client.set_max_in_flight(32);
    let mut buffers = vec![vec![0u8; 4096]; CHUNK_OPS];
    let mut scratch = vec![0u8; 4096];
    let mut samples = Samples::with_capacity(CHUNK_OPS);
    let all: Vec<u64> = (0..pages).collect();
    for chunk in all.chunks(CHUNK_OPS) {
        run_chunk(client, chunk, Operation::Read, &mut buffers, &mut samples)?;
        for (buffer, &page) in buffers.iter().zip(chunk) {
            let index = page % CHUNK_OPS as u64;
            ensure!(
                remem_local::pattern::check(buffer, index, 0, FILL_SEED, &mut scratch),
                "page {page} read back wrong"
            );
        }
    }
    Ok(pages)
}

pub fn print(cost: &EncryptionCost) {
    println!(
        "{} at queue depth {} over TCP, {} nodes per cluster: plaintext vs --encrypt (Noise, ChaCha20-Poly1305)",
        cost.scheme, cost.queue_depth, cost.nodes
    );
    println!(
        "{:<6} {:>14} {:>14} {:>14} {:>14} {:>10}",
        "op", "p50 plain us", "p99 plain us", "p50 enc us", "p99 enc us", "p50 ratio"
    );
    for row in &cost.rows {
        println!(
            "{:<6} {:>14.1} {:>14.1} {:>14.1} {:>14.1} {:>10.3}",
            row.operation,
            row.plaintext.p50_us,
            row.plaintext.p99_us,
            row.encrypted.p50_us,
            row.encrypted.p99_us,
            row.p50_ratio
        );
    }
    println!("{} pages read back and checked (both clusters)", cost.pages_verified);
}
