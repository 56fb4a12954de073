//! `remem bench fs`: `remem fs` beside a tmpfs and a directory on the local disk, in the same
//! run, driven from outside by Debian's programs (fio, sqlite3, tar), each workload's figure
//! reported beside the local disk's as a ratio.
//!
//! It starts its own cluster (10 nodes, shared memory by default, `--transport tcp` for TCP) and
//! `remem fs` on it (`--ephemeral`: the slabs go back at exit), mounts a tmpfs (root), and uses
//! a directory under `--dir` (default /var/tmp, which should be a local disk: a warning says so
//! when it is a tmpfs). Workloads run one target after the other, workload by workload, so the
//! three figures of a row are close in time on a noisy machine. Everything it starts is stopped
//! and unmounted by guards, also on error; its directory is removed at the end.

mod report;
mod targets;
mod workloads;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use remem_frontend::transport_arg::Transport;
use remem_local::units::parse_bytes;

pub use report::{print_table, FsBenchReport, FsRow, TARGETS};
use targets::{is_tmpfs, RememFsMount, RememFsOptions, TmpfsMount};
use workloads::FioJob;

#[derive(Args, Debug, Clone)]
pub struct FsBenchArgs {
    /// How `remem fs` reaches the nodes: shm (shared memory with the local nodes) or tcp.
    #[arg(long, value_enum, default_value = "shm")]
    pub transport: Transport,
    /// Memory nodes of the local cluster.
    #[arg(long, default_value_t = 10)]
    pub nodes: usize,
    /// Data splits per page (k).
    #[arg(long, short = 'k', default_value_t = 8)]
    pub data_splits: usize,
    /// Parity splits per page (r).
    #[arg(long, short = 'r', default_value_t = 2)]
    pub parity_splits: usize,
    /// `remem fs --size`: remote memory for the files' contents.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub size: u64,
    /// The file fio works on.
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    pub fio_size: u64,
    /// How long each fio job runs, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub fio_seconds: f64,
    /// Rows sqlite3 inserts.
    #[arg(long, default_value_t = 50_000)]
    pub sqlite_rows: u64,
    /// Rows per sqlite3 transaction (each commit syncs the WAL).
    #[arg(long, default_value_t = 1000)]
    pub sqlite_rows_per_transaction: u64,
    /// The tree tar archives and extracts (default: this repository's source, without
    /// target/ and .git/).
    #[arg(long)]
    pub tar_source: Option<PathBuf>,
    /// Times tar creates and extracts the tree on each target (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub tar_rounds: usize,
    /// Where the run's directory goes: the "local disk" target is in it (default /var/tmp).
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// More arguments for `remem fs`, each one value (e.g. `--fs-arg=--threads=8`).
    #[arg(long = "fs-arg", allow_hyphen_values = true)]
    pub fs_args: Vec<String>,
    /// A tiny run of everything (seconds, for the tests): an 8 MiB fio file, 0.3 s per fio job,
    /// 2,000 sqlite3 rows, one tar of crates/fs's source.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl FsBenchArgs {
    fn quick_sizes(&mut self) {
        self.size = self.size.min(64 << 20);
        self.fio_size = self.fio_size.min(8 << 20);
        self.fio_seconds = self.fio_seconds.min(0.3);
        self.sqlite_rows = self.sqlite_rows.min(2_000);
        self.tar_rounds = 1;
        if self.tar_source.is_none() {
            self.tar_source = Some(repository().join("crates/fs/src"));
        }
    }
}

/// This repository's root, as built.
fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The three directories of a run, set up in order and torn down in reverse.
struct Targets {
    remem: RememFsMount,
    tmpfs: TmpfsMount,
    disk: PathBuf,
}

impl Targets {
    fn directories(&self) -> [&Path; 3] {
        [&self.remem.mountpoint, &self.tmpfs.mountpoint, &self.disk]
    }
}

/// The run's directory: removed when dropped after a run that finished (the mounts in it are
/// gone by then); kept after a failure, with the logs of the nodes and `remem fs`, and named.
struct RunDir(PathBuf, bool);

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            eprintln!("remem bench fs: kept {} (the logs of the failed run)", self.0.display());
        }
    }
}

/// Runs the benchmark with the `remem` binary `binary`; the report has one row per workload.
pub fn run(mut args: FsBenchArgs, binary: &Path) -> Result<FsBenchReport> {
    if args.quick {
        args.quick_sizes();
    }
    if args.fio_size > args.size / 2 {
        bail!("--fio-size must be at most half of --size (the rest holds sqlite3's and tar's files)");
    }
    let source = args.tar_source.clone().unwrap_or_else(repository);
    let source = source.canonicalize().with_context(|| format!("the tar source {}", source.display()))?;
    let mut run_dir = RunDir(args.dir.join(format!("remem-bench-fs-{}", std::process::id())), false);
    std::fs::create_dir_all(&run_dir.0).with_context(|| format!("creating {}", run_dir.0.display()))?;
    let mut warnings = Vec::new();
    if is_tmpfs(&run_dir.0) {
        warnings.push(format!("{} is a tmpfs: the local disk column is memory too", args.dir.display()));
    }
    let disk = run_dir.0.join("disk");
    std::fs::create_dir_all(&disk)?;
    let options = RememFsOptions {
        nodes: args.nodes,
        size_bytes: args.size,
        data_splits: args.data_splits,
        parity_splits: args.parity_splits,
        transport: args.transport,
        extra_args: &args.fs_args,
    };
    let remem = RememFsMount::start(binary, &options, &run_dir.0)?;
    let tmpfs = TmpfsMount::start(&run_dir.0, args.size)?;
    let targets = Targets { remem, tmpfs, disk };
    let rows = measure(&args, &targets, &source)?;
    drop(targets);
    run_dir.1 = true;
    Ok(FsBenchReport {
        transport: args.transport,
        data_splits: args.data_splits,
        parity_splits: args.parity_splits,
        fs_args: args.fs_args.clone(),
        fio_size_bytes: args.fio_size,
        fio_seconds: args.fio_seconds,
        sqlite_rows: args.sqlite_rows,
        sqlite_rows_per_transaction: args.sqlite_rows_per_transaction,
        tar_rounds: args.tar_rounds.max(1),
        tar_source: source,
        rows,
        warnings,
    })
}

/// Every workload on every target, workload by workload.
fn measure(args: &FsBenchArgs, targets: &Targets, source: &Path) -> Result<Vec<FsRow>> {
    let mut rows = Vec::new();
    let runtime = Duration::from_secs_f64(args.fio_seconds.max(0.001));
    for job in FioJob::ALL {
        let mut figures = [0.0; 3];
        for (figure, dir) in figures.iter_mut().zip(targets.directories()) {
            *figure = workloads::fio(dir, job, args.fio_size, runtime)
                .with_context(|| format!("{} in {}", job.name(), dir.display()))?;
        }
        rows.push(FsRow::new(job.name(), job.unit(), figures));
    }
    for dir in targets.directories() {
        let _ = std::fs::remove_file(dir.join("fio.dat"));
    }
    let (mut inserts, mut selects) = ([0.0; 3], [0.0; 3]);
    for (index, dir) in targets.directories().into_iter().enumerate() {
        (inserts[index], selects[index]) =
            workloads::sqlite(dir, args.sqlite_rows, args.sqlite_rows_per_transaction)
                .with_context(|| format!("sqlite3 in {}", dir.display()))?;
    }
    rows.push(FsRow::new(format!("sqlite3 WAL insert {} rows", args.sqlite_rows), "s", inserts));
    rows.push(FsRow::new("sqlite3 WAL select pass".to_owned(), "s", selects));
    let (mut creates, mut extracts) = ([0.0; 3], [0.0; 3]);
    let rounds = args.tar_rounds.max(1);
    let mut samples = vec![[(0.0, 0.0); 3]; rounds];
    for round in &mut samples {
        for (sample, dir) in round.iter_mut().zip(targets.directories()) {
            *sample = workloads::tar(dir, source).with_context(|| format!("tar in {}", dir.display()))?;
        }
    }
    for index in 0..3 {
        creates[index] = median(samples.iter().map(|round| round[index].0).collect());
        extracts[index] = median(samples.iter().map(|round| round[index].1).collect());
    }
    rows.push(FsRow::new("tar create (source tree)".to_owned(), "s", creates));
    rows.push(FsRow::new("tar extract (source tree)".to_owned(), "s", extracts));
    Ok(rows)
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
