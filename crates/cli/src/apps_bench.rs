//! `remem bench apps`: an unmodified application with part of its memory local and the rest in
//! swap (seed 000 Table 2 and Figure 12), first step: one application, a pure-python3 PageRank
//! on a generated power-law (preferential attachment) graph, run through `remem run`'s cgroup
//! machinery.
//!
//! One unlimited run, with no swap on, measures the peak (cgroup usage) and the time: the 100%
//! baseline. Then, for each backend in turn (remem EC(8,2) swap on a fresh local 10-node cluster
//! over TCP, and a swap file on the local disk), the job runs limited to each fraction of that
//! peak. Reported: wall time and its ratio to the baseline (throughput ratio, 1.0 = as fast as
//! all in memory), swap-ins and swap-outs, and whether the job's output (rank sum and top
//! nodes, deterministic for a seed) equals the baseline's: swapping must never change results.
//!
//! Only one swap area is on at a time, and none may be on when the bench starts (swap
//! counters are system-wide). Everything it turns on is turned off by guards, also on error.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::code_args::CodeArgs;
use crate::launcher::{ClusterOptions, LocalCluster, UnixSockets};
use crate::run_command::{run_once, RememSwap, RememSwapOptions, RunReport};
use crate::units::format_bytes;

const MIB: u64 = 1 << 20;
const SLAB_BYTES: u64 = 4 * MIB;
const NODES: usize = 10;

/// The PageRank job: a Barabasi-Albert graph (each new node links to `m` earlier nodes picked in
/// proportion to their degree), `iterations` power iterations with damping 0.85 and dangling
/// mass spread evenly. Plain lists of Python objects, as a graph script would hold them.
const PAGERANK_SCRIPT: &str = r#"import random, sys
n, m, iterations, seed = map(int, sys.argv[1:5])
rng = random.Random(seed)
sources, targets, ends = [], [], list(range(m))
for v in range(m, n):
    for _ in range(m):
        u = ends[rng.randrange(len(ends))]
        sources.append(v)
        targets.append(u)
        ends.append(u)
    ends.extend([v] * m)
del ends
out_degree = [0] * n
for s in sources:
    out_degree[s] += 1
rank = [1.0 / n] * n
for _ in range(iterations):
    incoming = [0.0] * n
    dangling = sum(rank[i] for i in range(n) if out_degree[i] == 0)
    for s, t in zip(sources, targets):
        incoming[t] += rank[s] / out_degree[s]
    base = 0.15 / n + 0.85 * dangling / n
    rank = [base + 0.85 * x for x in incoming]
top = sorted(range(n), key=rank.__getitem__, reverse=True)[:5]
print("edges %d rank_sum %.12f top %s" % (len(sources), sum(rank), top))
"#;

#[derive(Args, Debug)]
pub struct AppsBenchArgs {
    /// A small graph (120k nodes, 2 iterations) at 100% and 50% only: for tests, under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Graph nodes (default 300000; 120000 with --quick).
    #[arg(long)]
    pub graph_nodes: Option<usize>,
    /// Edges each new graph node adds (the graph has about nodes x this edges).
    #[arg(long, default_value_t = 8)]
    pub edges_per_node: usize,
    /// PageRank iterations (default 10; 2 with --quick).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// Local memory as percentages of the measured peak (default 100,75,50; 100,50 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub percents: Vec<f64>,
    /// Work directory on the local disk: the disk swap file, the cluster, the job script.
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One limited run.
#[derive(Debug, Clone, Serialize)]
pub struct AppRun {
    pub backend: String,
    pub local_percent: f64,
    pub limit_bytes: u64,
    pub peak_bytes: Option<u64>,
    pub wall_seconds: f64,
    /// Baseline wall time over this one: the throughput ratio to the all-in-memory run.
    pub throughput_ratio: f64,
    pub swap_in_pages: u64,
    pub swap_out_pages: u64,
    pub output_matches_baseline: bool,
    /// The job's exit status: 137 is SIGKILL, the cgroup's OOM killer when swap could not keep up.
    pub exit_code: i32,
}

#[derive(Debug, Clone, Serialize)]
pub struct AppsReport {
    pub application: String,
    pub baseline_peak_bytes: u64,
    pub baseline_wall_seconds: f64,
    pub baseline_output: String,
    pub runs: Vec<AppRun>,
}

/// Runs the bench and prints its table (or JSON). Errors when setup fails, when a run fails,
/// or when any run's output differs from the baseline's (after printing the table).
pub fn run(args: AppsBenchArgs, binary: &Path) -> Result<AppsReport> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("remem bench apps needs root (memory cgroups, losetup, swapon)");
    }
    let swaps = std::fs::read_to_string("/proc/swaps").context("/proc/swaps")?;
    if swaps.lines().count() > 1 {
        bail!("swap is already on; the bench needs it off (one backend at a time):\n{swaps}");
    }
    let graph_nodes = args.graph_nodes.unwrap_or(if args.quick { 120_000 } else { 300_000 });
    let iterations = args.iterations.unwrap_or(if args.quick { 2 } else { 10 });
    let percents = if !args.percents.is_empty() {
        args.percents.clone()
    } else if args.quick {
        vec![100.0, 50.0]
    } else {
        vec![100.0, 75.0, 50.0]
    };
    if percents.iter().any(|&percent| !(percent > 0.0 && percent <= 100.0)) {
        bail!("--percents must lie in (0, 100]");
    }
    if graph_nodes <= args.edges_per_node || args.edges_per_node == 0 {
        bail!("--graph-nodes must exceed --edges-per-node, which must be positive");
    }
    let work_dir = args.dir.join(format!("remem-bench-apps-{}", std::process::id()));
    std::fs::create_dir_all(&work_dir).with_context(|| format!("creating {}", work_dir.display()))?;
    let _work_dir_guard = RemoveOnDrop(work_dir.clone());
    let script = work_dir.join("pagerank.py");
    std::fs::write(&script, PAGERANK_SCRIPT)?;
    let command: Vec<String> = vec![
        "python3".to_owned(),
        script.to_string_lossy().into_owned(),
        graph_nodes.to_string(),
        args.edges_per_node.to_string(),
        iterations.to_string(),
        "42".to_owned(),
    ];
    let application = format!(
        "pagerank (python3, {graph_nodes} nodes, {} edges per node, {iterations} iterations)",
        args.edges_per_node
    );

    let (baseline, baseline_output) = run_captured(&command, None, &work_dir)?;
    if baseline.exit_code != 0 {
        bail!("the unlimited job exited with status {}: {}", baseline.exit_code, baseline_output.trim());
    }
    let baseline_peak = baseline.peak_bytes.context("the cgroup reports no peak usage")?;
    eprintln!("baseline: {}", baseline.line());
    // The swap holds what does not fit, and then some: the kernel keeps swap slots of pages it
    // has read back in.
    let swap_bytes = (baseline_peak + 64 * MIB).div_ceil(SLAB_BYTES) * SLAB_BYTES;
    let limits: Vec<(f64, u64)> = percents
        .iter()
        .map(|&percent| (percent, ((baseline_peak as f64 * percent / 100.0) as u64).div_ceil(4096) * 4096))
        .collect();

    let mut runs = Vec::new();
    {
        let capacity_bytes = (swap_bytes * 2 / 8 + 8 * SLAB_BYTES).div_ceil(SLAB_BYTES) * SLAB_BYTES;
        let options = ClusterOptions {
            lease_grace: None,
            nodes: NODES,
            capacity_bytes,
            slab_size_bytes: SLAB_BYTES,
            nodes_per_domain: 1,
            dir: work_dir.join("cluster"),
            fault_injection: false,
            monitor_args: None,
            unix_sockets: UnixSockets::None,
        };
        let cluster = LocalCluster::start(binary, &options).context("starting the local cluster")?;
        let swap_options = RememSwapOptions {
            size_bytes: swap_bytes,
            priority: 100,
            cluster: Some(cluster.cluster_file_path.clone()),
            code: CodeArgs { data_splits: 8, parity_splits: 2, delta: 1 },
            runtime_dir: work_dir.join("remem-swap"),
        };
        let _swap = RememSwap::on(binary, &swap_options)?;
        for &(percent, limit) in &limits {
            let (report, output) = run_captured(&command, Some(limit), &work_dir)?;
            runs.push(app_run(
                "remem EC(8,2)",
                percent,
                limit,
                &report,
                &baseline,
                output == baseline_output,
            ));
        }
    }
    {
        let _swap = DiskSwap::on(&work_dir.join("disk-swapfile"), swap_bytes)?;
        for &(percent, limit) in &limits {
            let (report, output) = run_captured(&command, Some(limit), &work_dir)?;
            runs.push(app_run(
                "local disk file",
                percent,
                limit,
                &report,
                &baseline,
                output == baseline_output,
            ));
        }
    }
    let report = AppsReport {
        application,
        baseline_peak_bytes: baseline_peak,
        baseline_wall_seconds: baseline.wall.as_secs_f64(),
        baseline_output: baseline_output.trim().to_owned(),
        runs,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    // remem's runs must complete with the baseline's result. A disk-swap run the cgroup's OOM
    // killer stopped is the baseline's weakness, reported in the table, not a failure here.
    let on_remem = |run: &&AppRun| run.backend.starts_with("remem");
    let failed = report.runs.iter().filter(on_remem).filter(|run| run.exit_code != 0).count();
    let wrong = report.runs.iter().filter(|run| run.exit_code == 0 && !run.output_matches_baseline).count();
    if failed + wrong > 0 {
        bail!("{failed} runs on remem failed and {wrong} runs printed a result other than the baseline's");
    }
    Ok(report)
}

fn app_run(
    backend: &str,
    percent: f64,
    limit_bytes: u64,
    report: &RunReport,
    baseline: &RunReport,
    output_matches_baseline: bool,
) -> AppRun {
    AppRun {
        backend: backend.to_owned(),
        local_percent: percent,
        limit_bytes,
        peak_bytes: report.peak_bytes,
        wall_seconds: report.wall.as_secs_f64(),
        throughput_ratio: baseline.wall.as_secs_f64() / report.wall.as_secs_f64().max(1e-9),
        swap_in_pages: report.swap_in_pages,
        swap_out_pages: report.swap_out_pages,
        output_matches_baseline: output_matches_baseline && report.exit_code == 0,
        exit_code: report.exit_code,
    }
}

/// Runs the job once with its stdout captured. A job that fails is a result (reported in the
/// table), not an error; errors are the cgroup's or the spawn's.
fn run_captured(
    command: &[String],
    limit_bytes: Option<u64>,
    work_dir: &Path,
) -> Result<(RunReport, String)> {
    let output_path = work_dir.join("job.out");
    let output_file = std::fs::File::create(&output_path)?;
    let report = run_once(command, limit_bytes, Stdio::from(output_file))?;
    let output = std::fs::read_to_string(&output_path).unwrap_or_default();
    if report.exit_code != 0 {
        eprintln!("bench apps: the job failed: {}", report.line());
    }
    Ok((report, output))
}

pub fn print_table(report: &AppsReport) {
    println!("{}", report.application);
    println!(
        "baseline (100%, no limit, no swap): peak {}, {:.2} s, {}",
        format_bytes(report.baseline_peak_bytes),
        report.baseline_wall_seconds,
        report.baseline_output
    );
    println!(
        "{:<16} {:>7} {:>11} {:>9} {:>11} {:>10} {:>10} {:>7}",
        "swap backend", "local", "limit", "time s", "throughput", "swap-outs", "swap-ins", "output"
    );
    for run in &report.runs {
        println!(
            "{:<16} {:>6.0}% {:>11} {:>9.2} {:>10.2}x {:>10} {:>10} {:>7}",
            run.backend,
            run.local_percent,
            format_bytes(run.limit_bytes),
            run.wall_seconds,
            run.throughput_ratio,
            run.swap_out_pages,
            run.swap_in_pages,
            match (run.exit_code, run.output_matches_baseline) {
                (0, true) => "same".to_owned(),
                (0, false) => "WRONG".to_owned(),
                (137, _) => "killed".to_owned(),
                (code, _) => format!("exit {code}"),
            }
        );
    }
    println!("throughput: baseline time / this run's time (1.00x = as fast as all in memory)");
    println!("output: same as the baseline's, WRONG, killed (SIGKILL: the cgroup's OOM killer), or exit N");
}

/// A swap file on the local disk (the seed's "SSD backup" baseline); swapoff and removed on drop.
struct DiskSwap {
    path: PathBuf,
    on: bool,
}

impl DiskSwap {
    fn on(path: &Path, size_bytes: u64) -> Result<DiskSwap> {
        let mut swap = DiskSwap { path: path.to_owned(), on: false };
        let path_text = path.to_str().context("work directory is not UTF-8")?;
        tool("fallocate", &["-l", &size_bytes.to_string(), path_text])?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        tool("mkswap", &[path_text])?;
        tool("swapon", &[path_text]).context(
            "the local-disk baseline needs --dir on a disk file system that takes swap files (ext4, xfs; \
             not tmpfs or overlayfs)",
        )?;
        swap.on = true;
        Ok(swap)
    }
}

impl Drop for DiskSwap {
    fn drop(&mut self) {
        if self.on {
            if let Err(error) = tool("swapoff", &[&self.path.to_string_lossy()]) {
                eprintln!("bench apps: {error:#}: run swapoff {} yourself", self.path.display());
                return;
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes a directory tree on drop, unless something is still mounted under it.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let prefix = self.0.to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if mounts
            .lines()
            .any(|line| line.split_whitespace().nth(4).is_some_and(|point| point.starts_with(&prefix)))
        {
            eprintln!("bench apps: something is still mounted under {prefix}; left in place");
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a system tool (under `timeout`), failing with its stderr.
fn tool(program: &str, args: &[&str]) -> Result<()> {
    let output = Command::new("timeout")
        .args(["-k", "5", "120", program])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}
