//! `remem torture-writer` (hidden): a client that writes generation after generation of every
//! page until it is killed. The fault suite SIGKILLs it in the middle of a batch to leave torn
//! pages (some splits of the new version, some of the old), then reopens its saved slab map and
//! checks that no page ever reads back as a mix.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rand::rngs::StdRng;
use rand::SeedableRng;
use remem_client::cluster::ClusterFile;
use remem_client::{Client, ClientConfig, PageOp, Shape};
use remem_placement::LeastLoaded;
use remem_proto::auth::Secret;

use crate::units::parse_bytes;

/// Pattern seed of the torture writer; the checker uses the same.
pub const SEED: u64 = 0x7012;

#[derive(Args, Debug)]
pub struct TortureArgs {
    #[arg(long)]
    pub cluster: PathBuf,
    /// Where to save the slab map (written before the first page).
    #[arg(long)]
    pub map: PathBuf,
    #[arg(long, default_value = "8MiB", value_parser = parse_bytes)]
    pub size: u64,
    #[arg(long, default_value_t = 1000)]
    pub generations: u64,
}

pub fn run(args: TortureArgs) -> Result<()> {
    let cluster = ClusterFile::load(&args.cluster)?;
    let secret = Secret::load(Some(&cluster.secret_file)).context("loading the cluster secret")?;
    let mut config = ClientConfig::new(Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 }, args.size);
    config.release_on_drop = false;
    config.regenerate = false;
    let mut client = Client::connect(
        &cluster.addresses(),
        &secret,
        config,
        Box::new(LeastLoaded::new(StdRng::seed_from_u64(5))),
    )?;
    client.save_map(&args.map)?;
    let pages = client.page_count();
    let mut buffers = vec![vec![0u8; 4096]; 256];
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    for generation in 1..=args.generations {
        for first in (0..pages).step_by(buffers.len()) {
            let count = (pages - first).min(buffers.len() as u64) as usize;
            for (offset, buffer) in buffers[..count].iter_mut().enumerate() {
                crate::pattern::fill(buffer, first + offset as u64, generation, SEED);
            }
            let mut ops: Vec<PageOp<'_>> = buffers[..count]
                .iter()
                .enumerate()
                .map(|(offset, data)| PageOp::Write { page: first + offset as u64, data })
                .collect();
            client.execute_all(&mut ops).context("torture write failed")?;
        }
        writeln!(stdout, "generation {generation} written")?;
        stdout.flush()?;
    }
    Ok(())
}
