//! `remem bench apps`: unmodified applications with part of their memory local and the rest in
//! swap (seed 000 Table 2 and Figure 12), through `remem run`'s cgroup machinery.
//!
//! Applications (one file each): PageRank in python3 (`pagerank`), a TPC-B-like sqlite workload
//! (`sqlite`), memcached ETC-like and SYS-like with the bench's own verifying driver
//! (`memcached`), redis-server with redis-benchmark (`redis`). For each, one unlimited run with
//! no swap on measures the peak (cgroup usage of the job or the server), the throughput and the
//! p50/p99 latency: the 100% baseline. Then, one backend at a time (`backends`: remem EC(8,2),
//! remem rep(2), a swap file on the local disk), the application runs limited to each
//! percentage of that peak, and on the remem backends once more at `--failure-percent` with one
//! memory node SIGKILLed in the middle of its timed phase (`failure`). Every run is verified:
//! batch jobs print the baseline's result, servers give back every value exactly. `report`
//! prints the tables (ratios to the baseline), the JSON and the plots.
//!
//! Only one swap area is on at a time, and none may be on when the bench starts (swap
//! counters are system-wide). Everything it turns on is turned off by guards, also on error.

mod backends;
mod failure;
mod fault_path;
mod kv_client;
mod memcached;
mod pagerank;
mod redis;
mod report;
mod sqlite;
pub(crate) mod workload;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use backends::{Backend, DeviceStat, Limit, RemoveOnDrop, SwapOn, SLAB_BYTES};
use failure::Failure;
use fault_path::{DaemonStat, FaultPath};
use workload::ValueSizes;

use remem_host::cgroup::RunReport;

const MIB: u64 = 1 << 20;
const APPLICATIONS: [&str; 5] = ["pagerank", "sqlite", "memcached-etc", "memcached-sys", "redis"];

#[derive(Args, Debug)]
pub struct AppsBenchArgs {
    /// Small data sets at 100% and 50% only: for tests, seconds per run.
    #[arg(long)]
    pub quick: bool,
    /// Applications to run, of pagerank, sqlite, memcached-etc, memcached-sys, redis (default all).
    #[arg(long, value_delimiter = ',')]
    pub apps: Vec<String>,
    /// Backends, of ec (remem EC(8,2) swap), ec-shm (remem EC(8,2) swap over shared memory), rep
    /// (remem rep(2) swap), disk (a local disk swap file), uffd-shm and uffd (paging inside the
    /// process, `remem run --paging uffd`, EC(8,2) over shared memory and over TCP); default all.
    #[arg(long, value_delimiter = ',', value_parser = Backend::parse)]
    pub backends: Vec<Backend>,
    /// Local memory as percentages of the measured peak (default 100,75,50; 100,50 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub percents: Vec<f64>,
    /// The local percentage of the failure runs (remem backends: one memory node SIGKILLed
    /// half-way through the timed phase).
    #[arg(long, default_value_t = 50.0)]
    pub failure_percent: f64,
    /// Skip the failure runs.
    #[arg(long)]
    pub no_failure: bool,
    /// PageRank graph nodes (default 400000; 120000 with --quick).
    #[arg(long)]
    pub graph_nodes: Option<usize>,
    /// Edges each new graph node adds (the graph has about nodes x this edges).
    #[arg(long, default_value_t = 8)]
    pub edges_per_node: usize,
    /// PageRank iterations (default 10; 2 with --quick).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// sqlite accounts (default 500000, about 150 MiB; 40000 with --quick).
    #[arg(long)]
    pub sqlite_rows: Option<usize>,
    /// sqlite transactions (default 600000; 5000 with --quick).
    #[arg(long)]
    pub sqlite_transactions: Option<usize>,
    /// memcached keys (default 400000 ETC-like, a third of that SYS-like; 30000 with --quick).
    #[arg(long)]
    pub memcached_keys: Option<u64>,
    /// Seconds of memcached's timed phase (default 20; 3 with --quick).
    #[arg(long)]
    pub memcached_seconds: Option<f64>,
    /// redis keys loaded (default 400000; 30000 with --quick).
    #[arg(long)]
    pub redis_keys: Option<u64>,
    /// redis-benchmark GET requests; a quarter as many SETs (default 400000; 20000 with --quick).
    #[arg(long)]
    pub redis_requests: Option<u64>,
    /// Driver clients (connections) of memcached and loaders; redis-benchmark uses 4 times this.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Work directory on the local disk: the disk swap file, the clusters, the job scripts.
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// Write one PNG per application (throughput ratio vs local memory, a line per backend).
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// What one run of an application measured.
pub struct Measurement {
    /// The limited process: the job, or the server.
    pub process: RunReport,
    /// Operations (requests, transactions; for a batch job, runs) per second of the timed phase.
    pub ops_per_second: f64,
    /// Seconds from where a failure timer is armed to the end of the timed phase.
    pub phase_seconds: f64,
    pub latency_p50_us: Option<f64>,
    pub latency_p99_us: Option<f64>,
    /// Deterministic: must equal the baseline's.
    pub result: String,
    /// The application's own verification.
    pub check: Result<(), String>,
    pub node_killed_after: Option<Duration>,
}

/// What driving a server measured (memcached, redis): its timed phase, and whether every key
/// read back exact (an error otherwise).
pub struct Driven {
    pub ops_per_second: f64,
    pub seconds: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub node_killed_after: Option<Duration>,
}

/// Runs `command`, a server listening on `port`, in the memory cgroup (limited to `limit`, or
/// paged by the pager `limit` names), drives it from outside with `drive` once it accepts
/// connections, and stops it: the measurement of a server application. `keys` is what `drive`
/// verified.
pub fn run_server(
    command: &[String],
    limit: Option<&Limit>,
    port: u16,
    keys: u64,
    drive: impl FnOnce() -> Result<Driven>,
) -> Result<Measurement> {
    let mut server = remem_host::cgroup::LimitedChild::spawn_with_env(
        command,
        limit.and_then(Limit::cgroup_bytes),
        std::process::Stdio::null(),
        limit.map_or(&[], Limit::environment),
    )?;
    let outcome = workload::connect(&mut server, port, Duration::from_secs(10)).and_then(|_| drive());
    if let Err(error) = &outcome {
        // Where every thread of the server waits, read before it is stopped: a server that
        // stopped answering (once, memcached paged over TCP) says what it was stuck in.
        eprintln!("bench apps: the run failed ({error:#}); {}", thread_states(server.id()));
    }
    let report = server.stop(Duration::from_secs(10))?;
    let mut measurement = Measurement::failed(report, String::new());
    match outcome {
        Ok(driven) => {
            measurement.ops_per_second = driven.ops_per_second;
            measurement.phase_seconds = driven.seconds;
            measurement.latency_p50_us = driven.p50_us;
            measurement.latency_p99_us = driven.p99_us;
            measurement.node_killed_after = driven.node_killed_after;
            measurement.result = format!("{keys} keys read back exact");
            measurement.check = Ok(());
        }
        Err(error) => measurement.check = Err(format!("{error:#}")),
    }
    Ok(measurement)
}

/// Each thread of process `pid`: its name, state, the kernel function it waits in and the top
/// of its kernel stack (readable as root), one line each; what could not be read is left out.
fn thread_states(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("process {pid} is gone");
    };
    let mut lines = vec![format!("threads of process {pid} (comm, state, wchan, kernel stack):")];
    for task in tasks.flatten().take(64) {
        let path = task.path();
        let read = |name: &str| std::fs::read_to_string(path.join(name)).unwrap_or_default();
        let stat = read("stat");
        // The state is the field after the parenthesised name, which may hold spaces.
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).unwrap_or("?");
        let stack: Vec<String> = read("stack")
            .lines()
            .take(4)
            .filter_map(|frame| frame.split_whitespace().nth(1).map(str::to_owned))
            .collect();
        lines.push(format!(
            "  {} {} {} {} [{}]",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            state,
            read("wchan").trim(),
            stack.join(" < ")
        ));
    }
    lines.join("\n")
}

impl Measurement {
    /// A run that measured nothing (yet): `check` says why.
    fn failed(process: RunReport, why: String) -> Measurement {
        Measurement {
            process,
            ops_per_second: 0.0,
            phase_seconds: 0.0,
            latency_p50_us: None,
            latency_p99_us: None,
            result: String::new(),
            check: Err(why),
            node_killed_after: None,
        }
    }
}

enum Application {
    PageRank(pagerank::PageRank),
    Sqlite(sqlite::Sqlite),
    Memcached(memcached::Memcached),
    Redis(redis::Redis),
}

impl Application {
    fn describe(&self) -> String {
        match self {
            Application::PageRank(app) => app.describe(),
            Application::Sqlite(app) => app.describe(),
            Application::Memcached(app) => app.describe(),
            Application::Redis(app) => app.describe(),
        }
    }

    fn throughput_unit(&self) -> &'static str {
        match self {
            Application::PageRank(_) => "runs/s",
            Application::Sqlite(_) => "transactions/s",
            Application::Memcached(_) | Application::Redis(_) => "requests/s",
        }
    }

    fn run(&self, limit: Option<&Limit>, work_dir: &Path, failure: Option<Failure>) -> Result<Measurement> {
        match self {
            Application::PageRank(app) => app.run(limit, work_dir, failure),
            Application::Sqlite(app) => app.run(limit, work_dir, failure),
            Application::Memcached(app) => app.run(limit, work_dir, failure),
            Application::Redis(app) => app.run(limit, work_dir, failure),
        }
    }
}

/// One limited run, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct AppRun {
    pub backend: String,
    pub local_percent: f64,
    pub limit_bytes: u64,
    /// A failure run: one memory node SIGKILLed this long after the timed phase began (None
    /// when the phase ended before the kill was due).
    pub failure_run: bool,
    pub node_killed_after_seconds: Option<f64>,
    pub peak_bytes: Option<u64>,
    pub wall_seconds: f64,
    /// The timed phase: all of a batch job's life; the driven part of a server's.
    pub timed_seconds: f64,
    pub ops_per_second: f64,
    /// This run's throughput over the baseline's (1.0 = as fast as all in memory).
    pub throughput_ratio: f64,
    pub latency_p50_us: Option<f64>,
    pub latency_p99_us: Option<f64>,
    /// This run's latency over the baseline's (above 1.0 = slower).
    pub p50_ratio: Option<f64>,
    pub p99_ratio: Option<f64>,
    pub swap_in_pages: u64,
    pub swap_out_pages: u64,
    /// The process's exit status: 137 is SIGKILL, the cgroup's OOM killer when swap could not
    /// keep up.
    pub exit_code: i32,
    /// The application's checks passed and its result equals the baseline's.
    pub verified: bool,
    pub problem: Option<String>,
    /// The swap area's block device during the run (all its I/O: the loop device of remem
    /// swap, the whole disk partition under a swap file).
    pub swap_device: Option<SwapDevice>,
    /// Paging inside the process: the pager's counters at the application's exit (faults by
    /// kind, evictions, write-backs, the fetch and copy quantiles).
    pub pager: Option<serde_json::Value>,
}

impl AppRun {
    /// A run of `backend` at `local_percent` that has measured nothing yet (not verified).
    pub(crate) fn unmeasured(
        backend: &str,
        local_percent: f64,
        limit_bytes: u64,
        failure_run: bool,
    ) -> AppRun {
        AppRun {
            backend: backend.to_owned(),
            local_percent,
            limit_bytes,
            failure_run,
            node_killed_after_seconds: None,
            peak_bytes: None,
            wall_seconds: 0.0,
            timed_seconds: 0.0,
            ops_per_second: 0.0,
            throughput_ratio: 0.0,
            latency_p50_us: None,
            latency_p99_us: None,
            p50_ratio: None,
            p99_ratio: None,
            swap_in_pages: 0,
            swap_out_pages: 0,
            exit_code: -1,
            verified: false,
            problem: None,
            swap_device: None,
            pager: None,
        }
    }
}

/// A swap device's requests during one run: where a fault's time goes below the kernel's
/// swap code (for remem: loop -> FUSE -> `remem fs` -> engine -> nodes, all of it).
#[derive(Debug, Clone, Serialize)]
pub struct SwapDevice {
    pub reads: u64,
    pub read_kib: u64,
    /// Mean milliseconds from a read's submission to its completion.
    pub read_ms_mean: Option<f64>,
    /// Read milliseconds summed over requests (concurrent ones overlap), in seconds.
    pub read_seconds_total: f64,
    pub writes: u64,
    pub write_kib: u64,
    pub write_ms_mean: Option<f64>,
    /// Below the loop device, as the remem daemon measured it (remem backends).
    pub fault_path: Option<FaultPath>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AppReport {
    pub application: String,
    pub description: String,
    pub throughput_unit: String,
    pub baseline_peak_bytes: u64,
    pub baseline_wall_seconds: f64,
    pub baseline_ops_per_second: f64,
    pub baseline_latency_p50_us: Option<f64>,
    pub baseline_latency_p99_us: Option<f64>,
    pub baseline_result: String,
    pub runs: Vec<AppRun>,
}

/// Runs the bench and prints its tables (or JSON), and plots. Errors when setup fails, or when
/// a run on remem is not verified or any run gives a wrong result (after printing the tables).
pub fn run(args: AppsBenchArgs, binary: &Path) -> Result<Vec<AppReport>> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("remem bench apps needs root (memory cgroups, losetup, swapon)");
    }
    let swaps = std::fs::read_to_string("/proc/swaps").context("/proc/swaps")?;
    if swaps.lines().count() > 1 {
        bail!("swap is already on; the bench needs it off (one backend at a time):\n{swaps}");
    }
    let applications = applications(&args)?;
    let backends = if args.backends.is_empty() { Backend::ALL.to_vec() } else { args.backends.clone() };
    let percents = if !args.percents.is_empty() {
        args.percents.clone()
    } else if args.quick {
        vec![100.0, 50.0]
    } else {
        vec![100.0, 75.0, 50.0]
    };
    if percents.iter().chain([&args.failure_percent]).any(|&percent| !(percent > 0.0 && percent <= 100.0)) {
        bail!("--percents and --failure-percent must lie in (0, 100]");
    }
    if let Some(plot_dir) = &args.plot_dir {
        std::fs::create_dir_all(plot_dir).with_context(|| format!("creating {}", plot_dir.display()))?;
    }
    let work_dir = args.dir.join(format!("remem-bench-apps-{}", std::process::id()));
    std::fs::create_dir_all(&work_dir).with_context(|| format!("creating {}", work_dir.display()))?;
    let _work_dir_guard = RemoveOnDrop(work_dir.clone());

    let mut reports = Vec::new();
    for (key, application) in &applications {
        let report = bench_application(key, application, &backends, &percents, &args, binary, &work_dir)?;
        if !args.json {
            report::print_table(&report);
        }
        // Each application's plot as soon as it is done: a long bench stopped later keeps them.
        if let Some(plot_dir) = &args.plot_dir {
            let path = plot_dir.join(format!("apps-{}.png", report.application));
            report::plot_throughput(&path, &report)?;
            eprintln!("bench apps: wrote {}", path.display());
        }
        reports.push(report);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    // remem's runs must complete verified. A disk-swap run the cgroup's OOM killer stopped is
    // the baseline's weakness, reported in the table, not a failure here.
    let runs = || reports.iter().flat_map(|report| &report.runs);
    let on_remem = |run: &&AppRun| run.backend != Backend::DiskFile.name();
    let failed = runs().filter(|run| on_remem(run) && !run.verified).count();
    let wrong = runs().filter(|run| !on_remem(run) && !run.verified && run.exit_code != 137).count();
    if failed + wrong > 0 {
        bail!("{failed} runs on remem were not verified and {wrong} runs on disk swap failed otherwise than killed");
    }
    Ok(reports)
}

/// The applications `--apps` names, sized by the flags.
fn applications(args: &AppsBenchArgs) -> Result<Vec<(String, Application)>> {
    let quick = args.quick;
    let names: Vec<String> = if args.apps.is_empty() {
        APPLICATIONS.iter().map(|name| name.to_string()).collect()
    } else {
        args.apps.iter().map(|name| name.trim().to_owned()).collect()
    };
    if args.clients == 0 || args.clients > 64 {
        bail!("--clients must be between 1 and 64");
    }
    let memcached_keys = |default: u64| args.memcached_keys.unwrap_or(if quick { 30_000 } else { default });
    let memcached_seconds = args.memcached_seconds.unwrap_or(if quick { 3.0 } else { 20.0 });
    if !(memcached_seconds > 0.0 && memcached_seconds <= 3600.0) {
        bail!("--memcached-seconds must lie in (0, 3600]");
    }
    let mut applications = Vec::new();
    for name in names {
        let application = match name.as_str() {
            "pagerank" => {
                let app = pagerank::PageRank {
                    graph_nodes: args.graph_nodes.unwrap_or(if quick { 120_000 } else { 400_000 }),
                    edges_per_node: args.edges_per_node,
                    iterations: args.iterations.unwrap_or(if quick { 2 } else { 10 }),
                };
                if app.graph_nodes <= app.edges_per_node || app.edges_per_node == 0 {
                    bail!("--graph-nodes must exceed --edges-per-node, which must be positive");
                }
                Application::PageRank(app)
            }
            "sqlite" => {
                let app = sqlite::Sqlite {
                    rows: args.sqlite_rows.unwrap_or(if quick { 40_000 } else { 500_000 }),
                    transactions: args.sqlite_transactions.unwrap_or(if quick { 5_000 } else { 600_000 }),
                };
                if app.rows == 0 || app.transactions == 0 {
                    bail!("--sqlite-rows and --sqlite-transactions must be positive");
                }
                Application::Sqlite(app)
            }
            "memcached-etc" | "memcached-sys" => {
                let etc = name == "memcached-etc";
                Application::Memcached(memcached::Memcached {
                    sizes: if etc { ValueSizes::EtcLike } else { ValueSizes::SysLike },
                    get_fraction: if etc { 0.95 } else { 0.25 },
                    keys: memcached_keys(if etc { 400_000 } else { 133_000 }),
                    seconds: memcached_seconds,
                    clients: args.clients,
                })
            }
            "redis" => Application::Redis(redis::Redis {
                keys: args.redis_keys.unwrap_or(if quick { 30_000 } else { 400_000 }),
                requests: args.redis_requests.unwrap_or(if quick { 20_000 } else { 400_000 }).max(1),
                clients: args.clients,
            }),
            other => bail!("{other:?}: --apps takes {}", APPLICATIONS.join(", ")),
        };
        applications.push((name, application));
    }
    let keys = [args.memcached_keys, args.redis_keys].into_iter().flatten();
    if keys.clone().any(|keys| keys < 2 * args.clients as u64 || keys > 100_000_000) {
        bail!("--memcached-keys and --redis-keys must lie in [2 x --clients, 100000000]");
    }
    Ok(applications)
}

fn bench_application(
    key: &str,
    application: &Application,
    backends: &[Backend],
    percents: &[f64],
    args: &AppsBenchArgs,
    binary: &Path,
    work_dir: &Path,
) -> Result<AppReport> {
    eprintln!("bench apps: {}", application.describe());
    let baseline = application.run(None, work_dir, None)?;
    if let Err(problem) = &baseline.check {
        bail!("{key}: the unlimited run failed: {problem}");
    }
    let baseline_peak = baseline.process.peak_bytes.context("the cgroup reports no peak usage")?;
    eprintln!(
        "baseline: {} {:.1} {}",
        baseline.process.line(),
        baseline.ops_per_second,
        application.throughput_unit()
    );
    // The swap holds what does not fit, and then some: the kernel keeps swap slots of pages it
    // has read back in.
    let swap_bytes = (baseline_peak + 64 * MIB).div_ceil(SLAB_BYTES) * SLAB_BYTES;
    let limit_of =
        |percent: f64| ((baseline_peak as f64 * percent / 100.0) as u64).div_ceil(4096).max(256) * 4096;
    let mut runs: Vec<AppRun> = Vec::new();
    for &backend in backends {
        let swap = SwapOn::start(binary, backend, swap_bytes, work_dir)
            .with_context(|| format!("turning on swap on {}", backend.name()))?;
        for &percent in percents {
            let before = (swap.device_stat(), swap.daemon_stat());
            let limit = swap.limit(limit_of(percent), work_dir)?;
            let measured = application.run(Some(&limit), work_dir, None);
            runs.push(app_run(backend, percent, limit_of(percent), None, measured, &baseline));
            finish_run(runs.last_mut().expect("just pushed"), &limit, before, &swap);
            eprintln!("bench apps: {}", report::row_line(runs.last().expect("just pushed")));
        }
        if backend.is_remem() && !args.no_failure {
            // Half-way through the timed phase of the same backend's run at that percentage, or
            // of the baseline's when that is shorter: a run with a failure may be faster than the
            // run before it (a sqlite run at 50% took 3.0 s, then 1.5 s: the kill at 1.5 s came
            // after its end), but hardly faster than the job with all its memory.
            let previous = runs
                .iter()
                .rev()
                .find(|run| run.backend == backend.name() && run.local_percent == args.failure_percent)
                .map(|run| run.timed_seconds);
            let reference = [previous, Some(baseline.phase_seconds)]
                .into_iter()
                .flatten()
                .filter(|&seconds| seconds > 0.0)
                .reduce(f64::min)
                .unwrap_or(baseline.phase_seconds);
            let pid = swap.victim_pid().context("the node to kill is not running")?;
            let failure = Failure { pid, delay: Duration::from_secs_f64(reference / 2.0) };
            let limit = swap.limit(limit_of(args.failure_percent), work_dir)?;
            let before = (swap.device_stat(), swap.daemon_stat());
            let measured = application.run(Some(&limit), work_dir, Some(failure));
            runs.push(app_run(
                backend,
                args.failure_percent,
                limit.bytes,
                Some(failure),
                measured,
                &baseline,
            ));
            finish_run(runs.last_mut().expect("just pushed"), &limit, before, &swap);
            eprintln!("bench apps: {}", report::row_line(runs.last().expect("just pushed")));
        }
        drop(swap);
    }
    Ok(AppReport {
        application: key.to_owned(),
        description: application.describe(),
        throughput_unit: application.throughput_unit().to_owned(),
        baseline_peak_bytes: baseline_peak,
        baseline_wall_seconds: baseline.process.wall.as_secs_f64(),
        baseline_ops_per_second: baseline.ops_per_second,
        baseline_latency_p50_us: baseline.latency_p50_us,
        baseline_latency_p99_us: baseline.latency_p99_us,
        baseline_result: baseline.result.clone(),
        runs,
    })
}

type Counters = (Option<DeviceStat>, Option<DaemonStat>);

/// After a run: the swap device's and daemon's share, or the pager's counters (and its slabs
/// given back).
fn finish_run(run: &mut AppRun, limit: &Limit, before: Counters, swap: &SwapOn) {
    set_device(run, before, (swap.device_stat(), swap.daemon_stat()));
    if let Some(pager) = &limit.pager {
        run.pager = pager.finish().and_then(|line| serde_json::from_str(&line).ok());
    }
}

/// The swap device's share of a run: its requests and their mean time in the device, and for
/// remem the daemon's split of it.
fn set_device(run: &mut AppRun, before: Counters, after: Counters) {
    let fault_path = match (before.1, after.1) {
        (Some(before), Some(after)) => Some(FaultPath::from_delta(&after.since(&before))),
        _ => None,
    };
    let (Some(before), Some(after)) = (before.0, after.0) else { return };
    let delta = after.since(&before);
    let mean = |ms: u64, requests: u64| (requests > 0).then(|| ms as f64 / requests as f64);
    run.swap_device = Some(SwapDevice {
        reads: delta.reads,
        read_kib: delta.read_sectors / 2,
        read_ms_mean: mean(delta.read_ms, delta.reads),
        read_seconds_total: delta.read_ms as f64 / 1000.0,
        writes: delta.writes,
        write_kib: delta.write_sectors / 2,
        write_ms_mean: mean(delta.write_ms, delta.writes),
        fault_path,
    });
}

fn app_run(
    backend: Backend,
    percent: f64,
    limit_bytes: u64,
    failure: Option<Failure>,
    measured: Result<Measurement>,
    baseline: &Measurement,
) -> AppRun {
    let ratio = |value: Option<f64>, base: Option<f64>| match (value, base) {
        (Some(value), Some(base)) if base > 0.0 => Some(value / base),
        _ => None,
    };
    let mut run = AppRun::unmeasured(backend.name(), percent, limit_bytes, failure.is_some());
    let measurement = match measured {
        Ok(measurement) => measurement,
        Err(error) => {
            run.problem = Some(format!("{error:#}"));
            return run;
        }
    };
    run.node_killed_after_seconds = measurement.node_killed_after.map(|after| after.as_secs_f64());
    run.peak_bytes = measurement.process.peak_bytes;
    run.wall_seconds = measurement.process.wall.as_secs_f64();
    run.timed_seconds = measurement.phase_seconds;
    // A run that did not complete (a job the OOM killer stopped, a driver that failed) did no
    // useful work: a batch job's 1 / wall time would otherwise look fast.
    if measurement.check.is_ok() {
        run.ops_per_second = measurement.ops_per_second;
        run.throughput_ratio = measurement.ops_per_second / baseline.ops_per_second.max(1e-12);
    }
    run.latency_p50_us = measurement.latency_p50_us;
    run.latency_p99_us = measurement.latency_p99_us;
    run.p50_ratio = ratio(measurement.latency_p50_us, baseline.latency_p50_us);
    run.p99_ratio = ratio(measurement.latency_p99_us, baseline.latency_p99_us);
    run.swap_in_pages = measurement.process.swap_in_pages;
    run.swap_out_pages = measurement.process.swap_out_pages;
    run.exit_code = measurement.process.exit_code;
    run.problem = match (&measurement.check, measurement.result == baseline.result) {
        (Err(problem), _) => Some(problem.clone()),
        (Ok(()), false) => {
            Some(format!("result {:?}, the baseline's {:?}", measurement.result, baseline.result))
        }
        (Ok(()), true) => None,
    };
    run.verified = run.problem.is_none();
    run
}

#[cfg(test)]
mod tests {
    #[test]
    fn thread_states_list_every_thread_with_its_state_and_a_gone_process_says_so() {
        let sleeper = std::thread::Builder::new()
            .name("states-probe".into())
            .spawn(|| std::thread::sleep(std::time::Duration::from_secs(2)))
            .expect("a thread");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let states = super::thread_states(std::process::id());
        let line =
            states.lines().find(|line| line.contains("states-probe")).unwrap_or_else(|| panic!("{states}"));
        // Asleep: S (interruptible), in a kernel wait function.
        assert!(line.contains(" S "), "{line}");
        assert!(states.lines().count() >= 3, "the header, the test's thread and the sleeper: {states}");
        sleeper.join().expect("joins");
        assert_eq!(super::thread_states(u32::MAX), format!("process {} is gone", u32::MAX));
    }
}
