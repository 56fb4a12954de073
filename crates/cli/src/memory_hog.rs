//! `remem memory-hog` (hidden): a bounded memory hog for the resource-monitor test. It joins a
//! cgroup if asked, allocates and touches `--bytes` in steps, prints `held BYTES`, then holds the
//! memory until killed or until `--hold` passes, so a forgotten hog still ends.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::units::{parse_bytes, parse_duration};

/// The most a hog may take: it is a test helper, not a way to exhaust a machine.
const MAX_HOG_BYTES: u64 = 64 << 30;

#[derive(Args, Debug)]
pub struct MemoryHogArgs {
    /// Bytes to allocate and touch (at most 64 GiB).
    #[arg(long, value_parser = parse_bytes)]
    pub bytes: u64,
    /// Allocate in steps of this many bytes.
    #[arg(long, default_value = "16MiB", value_parser = parse_bytes)]
    pub step_bytes: u64,
    /// Pause between steps.
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    pub step_pause: Duration,
    /// Exit after holding the memory this long.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub hold: Duration,
    /// A `cgroup.procs` file to write this process's PID into before allocating.
    #[arg(long)]
    pub join_cgroup: Option<PathBuf>,
}

pub fn run(args: MemoryHogArgs) -> Result<()> {
    if args.bytes > MAX_HOG_BYTES {
        bail!("--bytes {} is above the 64 GiB a hog may take", args.bytes);
    }
    if let Some(procs) = &args.join_cgroup {
        std::fs::write(procs, std::process::id().to_string())
            .with_context(|| format!("joining cgroup {}", procs.display()))?;
    }
    let step_bytes = args.step_bytes.clamp(4096, 1 << 30);
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut held: u64 = 0;
    while held < args.bytes {
        let step = step_bytes.min(args.bytes - held);
        // A non-zero fill writes every page, so the memory is really charged.
        chunks.push(vec![0xa5; step as usize]);
        held += step;
        std::thread::sleep(args.step_pause);
    }
    println!("held {held}");
    std::io::stdout().flush()?;
    std::thread::sleep(args.hold);
    drop(chunks);
    Ok(())
}
