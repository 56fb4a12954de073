//! `remem run --memory-limit SIZE|PERCENT -- COMMAND`: runs an unmodified program in a fresh
//! memory cgroup (v1 where its hierarchy is mounted, else v2) limited below its footprint, so
//! that what does not fit goes to swap, which should be remem swap (`remem swap on`, or
//! `--swap-size` for the length of the run).
//!
//! The command joins the cgroup between fork and exec, so every page it touches is charged
//! there. Reported on stderr: the cgroup's peak usage (anonymous memory and page cache), the
//! system-wide swap-ins and swap-outs of the run (`/proc/vmstat` deltas: other processes
//! swapping at the same time are counted too), wall time and exit status. `remem run` exits with
//! the command's status (128 + signal when it was killed).
//!
//! Cleanup invariant: the cgroup is removed (its leftover processes SIGKILLed first) and a swap
//! area turned on by `--swap-size` is turned off, on success, on error and on panic, by guards.
//! SIGINT or SIGTERM during the swap set-up is handed to `remem swap on`, which undoes its steps;
//! `remem run` then turns off whatever was turned on and fails. Only a SIGKILL of `remem run`
//! itself leaves them: the next `remem run --swap-size` turns off the swap of runs that are gone
//! (their `run-swap-PID` directories, see [`runs_dir`]) and removes their directories;
//! `remem swap off --runtime-dir DIR` and `rmdir` of the cgroup clean up otherwise.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::code_args::CodeArgs;
use crate::units::parse_bytes;
use remem_host::cgroup::run_once;
use remem_host::swap::{RememSwap, RememSwapOptions};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The command's memory limit: a size (`512MiB`) or a percentage (`50%`) of its peak, which
    /// a first, unlimited run of the same command measures (the command then runs twice).
    #[arg(long, value_parser = parse_memory_limit)]
    pub memory_limit: MemoryLimit,
    /// Turn on remem swap of this size for the run (`remem swap on`) and off after it. Without
    /// it, swap must already be on (`remem swap on --size SIZE`).
    #[arg(long, value_parser = parse_bytes)]
    pub swap_size: Option<u64>,
    /// Swap priority of the swap area `--swap-size` turns on (higher is used first).
    #[arg(long, default_value_t = 100)]
    pub swap_priority: i32,
    /// Cluster file for `--swap-size` (default: the `remem up` default directory).
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    #[command(flatten)]
    pub code: CodeArgs,
    /// Runtime directory of the swap area `--swap-size` turns on (default: one per run,
    /// RUNS/run-swap-PID, where RUNS is $XDG_RUNTIME_DIR/remem if set, else /run/remem for
    /// root, else the `remem up` default directory).
    #[arg(long)]
    pub swap_runtime_dir: Option<PathBuf>,
    /// How the command's memory pages to remem. `kernel`: the command runs in a memory cgroup
    /// and the kernel swaps to remem swap (a loop device over `remem fs`). `uffd`: inside the
    /// process, with no swap device and no cgroup: a preloaded library serves the command's
    /// page faults from remem through userfaultfd and keeps its large private anonymous memory
    /// within the limit (needs root; docs/PAGING.md).
    #[arg(long, value_enum, default_value_t = Paging::Kernel)]
    pub paging: Paging,
    /// With --paging uffd: the size of the command's remem region, which bounds how much of
    /// its memory can be paged out (default: 4 times the limit).
    #[arg(long, value_parser = parse_bytes)]
    pub remote_size: Option<u64>,
    /// With --paging uffd: how the pager reaches the nodes' memory (shm for the nodes on this
    /// host, TCP otherwise).
    #[arg(long, value_enum, default_value_t = crate::transport_arg::Transport::Shm)]
    pub transport: crate::transport_arg::Transport,
    /// Encrypt the TCP connections to the nodes (nodes started with `--encrypt` require it;
    /// shared memory and Unix sockets are never encrypted).
    #[arg(long)]
    pub encrypt: bool,
    /// With --paging uffd: microseconds the pager polls for the next fault before it sleeps
    /// (a sleeping pager costs a wake-up per fault; a polling one a share of a core).
    #[arg(long, default_value_t = remem_host::paging::DEFAULT_SPIN_US)]
    pub spin_us: u64,
    /// With --paging uffd: percent of the resident pages kept for pages used again after the
    /// pager moved them out (the protected segment, docs/PAGING.md; 0: one FIFO; at most 90).
    #[arg(long, default_value_t = remem_host::paging::DEFAULT_PROTECTED_PERCENT,
          value_parser = clap::value_parser!(u64).range(0..=90))]
    pub protected_percent: u64,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// Where the paging of `remem run` happens.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Paging {
    Kernel,
    Uffd,
}

/// A memory limit as given on the command line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryLimit {
    Bytes(u64),
    /// Of the peak an unlimited run measures, in (0, 100].
    PercentOfPeak(f64),
}

pub fn parse_memory_limit(text: &str) -> Result<MemoryLimit, String> {
    if let Some(number) = text.trim().strip_suffix('%') {
        let percent: f64 = number.trim().parse().map_err(|_| format!("{text:?}: not a percentage"))?;
        if !(percent > 0.0 && percent <= 100.0) {
            return Err(format!("{text:?}: a percentage must be in (0, 100]"));
        }
        return Ok(MemoryLimit::PercentOfPeak(percent));
    }
    let bytes = parse_bytes(text)?;
    if bytes < (1 << 20) {
        return Err(format!("{text:?}: a memory limit below 1 MiB cannot run a program"));
    }
    Ok(MemoryLimit::Bytes(bytes))
}

/// Runs the command as `args` say and returns its exit code (after cleanup).
pub fn run(args: RunArgs, binary: &Path) -> Result<i32> {
    if args.paging == Paging::Uffd {
        return run_paged(&args, binary);
    }
    // Until the command runs, an interrupt means: undo the set-up and stop.
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handlers = Vec::new();
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        handlers.push(signal_hook::flag::register(signal, std::sync::Arc::clone(&interrupted))?);
    }
    let _swap = match args.swap_size {
        Some(size) => {
            clean_runs_that_are_gone(binary);
            let runtime_dir = args
                .swap_runtime_dir
                .clone()
                .unwrap_or_else(|| runs_dir().join(format!("run-swap-{}", std::process::id())));
            let options = RememSwapOptions {
                size_bytes: size,
                priority: args.swap_priority,
                cluster: args.cluster.clone(),
                code: args.code.clone(),
                runtime_dir,
                shared_memory: false,
                encrypt: args.encrypt,
                metrics: None,
            };
            let swap = RememSwap::on_unless_interrupted(binary, &options, &interrupted)?;
            if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
                drop(swap);
                bail!("interrupted while turning swap on: what was set up is undone");
            }
            Some(swap)
        }
        None => {
            if swap_total_bytes() == 0 {
                bail!(
                    "no swap is on, so nothing would page out of the limit: run `remem swap on \
                     --size SIZE` first, or pass --swap-size"
                );
            }
            None
        }
    };
    // The set-up is done: signals act as before it (SIGTERM ends this process).
    for handler in handlers {
        signal_hook::low_level::unregister(handler);
    }
    // SAFETY: setting a signal disposition to its default has no preconditions (signal-hook's
    // handler, whose actions are all gone, would otherwise swallow SIGTERM).
    unsafe { libc::signal(libc::SIGTERM, libc::SIG_DFL) };
    // SIGINT reaches the command from the terminal; this process outlives it to clean up.
    // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
    let previous_sigint = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let result = run_limited(&args);
    // SAFETY: restores the disposition read above.
    unsafe { libc::signal(libc::SIGINT, previous_sigint) };
    result
}

fn run_limited(args: &RunArgs) -> Result<i32> {
    let limit_bytes = match args.memory_limit {
        MemoryLimit::Bytes(bytes) => bytes,
        MemoryLimit::PercentOfPeak(percent) => {
            let report = run_once(&args.command, None, Stdio::inherit())?;
            eprintln!("{} [unlimited run, to measure the peak]", report.line());
            if report.exit_code != 0 {
                // Its peak is still the program's footprint; the limited run's status is returned.
                eprintln!("remem run: note: the unlimited run exited with status {}", report.exit_code);
            }
            let peak = report.peak_bytes.context("the cgroup reports no peak usage (memory.peak missing)")?;
            let limit = (peak as f64 * percent / 100.0) as u64;
            limit.div_ceil(4096).max(256) * 4096
        }
    };
    let report = run_once(&args.command, Some(limit_bytes), Stdio::inherit())?;
    eprintln!("{}", report.line());
    Ok(report.exit_code)
}

/// `--paging uffd`: the command runs with the preload library, its limit enforced by the pager.
fn run_paged(args: &RunArgs, binary: &Path) -> Result<i32> {
    if args.swap_size.is_some() {
        bail!("--swap-size turns on kernel swap: it does not go with --paging uffd (see --remote-size)");
    }
    let cluster = remem_frontend::cluster_file::cluster_file_path(args.cluster.as_deref());
    let file = remem_client::cluster::ClusterFile::load(&cluster).with_context(|| {
        "--paging uffd pages to a running cluster (`remem up`, or --cluster FILE)".to_owned()
    })?;
    crate::transport_arg::check_transport(args.transport, &file, &cluster)?;
    remem_host::paging::library_beside(binary)?;
    let limit_bytes = match args.memory_limit {
        MemoryLimit::Bytes(bytes) => bytes,
        MemoryLimit::PercentOfPeak(percent) => {
            let report = run_once(&args.command, None, Stdio::inherit())?;
            eprintln!("{} [unlimited run, to measure the peak]", report.line());
            let peak = report.peak_bytes.context("the cgroup reports no peak usage (memory.peak missing)")?;
            ((peak as f64 * percent / 100.0) as u64).div_ceil(4096).max(256) * 4096
        }
    };
    let shape = args.code.shape()?;
    let options = remem_host::paging::PagedOptions {
        cluster,
        limit_bytes,
        remote_bytes: args.remote_size.unwrap_or(limit_bytes.saturating_mul(4)),
        data_splits: shape.data_splits,
        parity_splits: shape.parity_splits,
        shared_memory: args.transport == crate::transport_arg::Transport::Shm,
        encrypt: args.encrypt || file.encrypt,
        spin: std::time::Duration::from_micros(args.spin_us),
        min_bytes: remem_host::paging::DEFAULT_MIN_BYTES,
        protected_percent: args.protected_percent,
        stats: None,
        map: None,
    };
    // SIGINT reaches the command from the terminal; this process outlives it to report.
    // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
    let previous_sigint = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let report = remem_host::paging::run_paged(binary, &args.command, &options);
    // SAFETY: restores the disposition read above.
    unsafe { libc::signal(libc::SIGINT, previous_sigint) };
    let report = report?;
    eprintln!("{}", report.line());
    if let Some(stats) = &report.stats {
        eprintln!("remem run: pager {stats}");
    }
    Ok(report.exit_code)
}

/// Turns off the swap of earlier `remem run --swap-size` runs that are gone (SIGKILLed or
/// crashed: their `run-swap-PID` directory is left in [`runs_dir`], and no `remem run` has that
/// PID), and removes their directories, saying so.
fn clean_runs_that_are_gone(binary: &Path) {
    let Ok(entries) = std::fs::read_dir(runs_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("run-swap-").and_then(|pid| pid.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || remem_host::process::is_remem(pid, "run") {
            continue;
        }
        eprintln!(
            "remem run: {} is left by a run that is gone (pid {pid}): turning its swap off",
            entry.path().display()
        );
        drop(RememSwap::adopt(binary, entry.path()));
    }
}

/// Where each `remem run --swap-size` keeps its swap area's runtime directory: the user's
/// runtime directory when there is one; for root without one, /run/remem (root's own tmpfs for
/// runtime state, emptied at boot as a swap area's state is, and apart from the `remem up`
/// cluster directory in /tmp); else the `remem up` default directory.
fn runs_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() && root && Path::new("/run").is_dir() {
        return PathBuf::from("/run/remem");
    }
    crate::launcher::default_dir()
}

/// Total swap space on, from `/proc/swaps` (KiB column), in bytes.
fn swap_total_bytes() -> u64 {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum::<u64>()
        * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_limit_is_a_size_or_a_percentage_of_the_peak() {
        assert_eq!(parse_memory_limit("24MiB"), Ok(MemoryLimit::Bytes(24 << 20)));
        assert_eq!(parse_memory_limit("50%"), Ok(MemoryLimit::PercentOfPeak(50.0)));
        assert_eq!(parse_memory_limit("75.5 %"), Ok(MemoryLimit::PercentOfPeak(75.5)));
        assert!(parse_memory_limit("0%").is_err());
        assert!(parse_memory_limit("150%").is_err());
        assert!(parse_memory_limit("4KiB").is_err());
        assert!(parse_memory_limit("lots").is_err());
    }
}
