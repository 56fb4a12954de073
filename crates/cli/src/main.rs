//! `remem`: resilient remote memory. See `remem --help`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, Parser, Subcommand};
use remem::launcher::{ClusterOptions, LocalCluster, NodeMetrics};
use tracing_subscriber::EnvFilter;

/// Resilient remote memory: memory nodes lend RAM in slabs; clients store 4 KiB pages there,
/// Reed-Solomon coded (k data + r parity splits) across nodes, so that dead, slow or corrupted
/// nodes cost neither data nor tail latency.
///
/// Start here: `remem demo` runs a 10-node cluster on this machine, writes 1 GiB with EC(8,2),
/// verifies every page and prints latencies and memory overhead.
#[derive(Parser, Debug)]
#[command(name = "remem", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a memory node: lends up to --capacity bytes of RAM as slabs to authenticated clients.
    ///
    /// The cluster secret comes from --secret-file or the REMEM_SECRET environment variable
    /// (never the command line). Logs go to stderr (set REMEM_LOG=debug for more); the first
    /// stdout line is `listening ADDRESS`. Stops cleanly on SIGTERM or Ctrl-C. Settings may come
    /// from a TOML file (--config); flags on the command line win over it.
    #[command(args_override_self = true)]
    Node(remem::node::NodeArgs),
    /// Start a local cluster of N node processes on 127.0.0.1 and keep it up until Ctrl-C or
    /// SIGTERM. Writes DIR/cluster.json, which `remem bench --cluster` reads.
    Up(UpArgs),
    /// Start a 10-node local cluster, write 1 GiB of pages with EC(8,2), read and verify every
    /// page, print latencies and memory overhead, stop the cluster.
    Demo(remem::demo::DemoArgs),
    /// Serve a remem address space as an NBD block device (qemu, nbd-client, libnbd): swap or a
    /// file system on resilient remote memory. See docs/NBD.md. First stdout line: `listening ADDRESS`.
    Nbd(remem::nbd_command::NbdArgs),
    /// Serve a memcached-compatible cache whose values live in remem, each object with its own
    /// redundancy (none, rep2, rep3, EC, EOR) and LRU eviction. See docs/KV.md. First stdout
    /// line: `listening ADDRESS`.
    Kv(remem::kv_command::KvArgs),
    /// Mount a file system whose file contents live in remem (EC(8,2) by default): sparse and
    /// TiB-sized files, direct I/O for loop devices, unmounted on SIGTERM or Ctrl-C. Only the
    /// mounting user may enter it unless --allow-other. See docs/FS.md. First stdout line:
    /// `mounted MOUNTPOINT`.
    Fs(remem::fs_command::FsArgs),
    /// Kernel swap on remem without kernel modules: `remem swap on --size 8GiB [--priority N]`
    /// (a file on a `remem fs` mount, a loop device with direct I/O, mkswap, swapon) and
    /// `remem swap off` (undoes everything, also after a crash). Needs root. See docs/FS.md.
    #[command(subcommand)]
    Swap(remem::swap_command::SwapCommand),
    /// Run COMMAND in a fresh memory cgroup limited to --memory-limit (a size, or a percentage
    /// of the peak a first unlimited run measures), so what does not fit goes to remem swap
    /// (already on, or on for the run with --swap-size). Reports peak memory, swap-ins and
    /// swap-outs, wall time and exit status on stderr; exits with COMMAND's status. Needs root.
    Run(remem::run_command::RunArgs),
    /// Every node of the cluster: up or down, failure domain, capacity, memory used and free,
    /// slabs, rebuilds running with their progress (table, --json, or --watch SECONDS).
    ///
    /// Exit status (without --watch): 0 every node up, 3 some nodes down (degraded), 4 every node
    /// down (or none listed), 1 the command itself failed (no cluster file, bad flags...).
    Status(remem::status_command::StatusArgs),
    /// Benchmarks: `remem bench pages` (schemes vs transport floors, over TCP or same-host
    /// shared memory, or with one straggler), `remem bench codec` (erasure coding vs Intel
    /// ISA-L), `remem bench regen` (rebuilding a slab under load) and `remem bench kv` (remem
    /// kv vs memcached).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Simulate placement policies: probability of data loss when f% of N nodes fail at once
    /// (seed closed form and Monte Carlo over real layouts) and load balance, as a table, CSV,
    /// JSON and the PNG figures of seed 000 Figures 15 and 16. The default run takes under a
    /// minute on 2 cores; --full covers the figures' ranges.
    Sim(remem::sim_command::SimArgs),
    /// Print a shell completion script: `source <(remem completions bash)`.
    Completions(remem::completions::CompletionsArgs),
    /// Write manual pages (remem.1 and one per subcommand, e.g. remem-node.1) into --dir.
    Man(remem::manpage::ManArgs),
    /// Print a document that the help texts and manual pages name (`remem docs KV` for
    /// docs/KV.md), built into the binary; without a name, the list.
    Docs(remem::docs_command::DocsArgs),
    /// Writes every page again and again until killed (fault-suite helper).
    #[command(hide = true)]
    TortureWriter(remem::torture::TortureArgs),
    /// Allocates, touches and holds memory, optionally in a cgroup (resource-monitor test helper).
    #[command(hide = true)]
    MemoryHog(remem::memory_hog::MemoryHogArgs),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Page write/read latency and throughput at queue depth 1 and 32 for EC(8,2) delta 1 and
    /// 0, rep(2) and none, beside a raw 4 KiB round trip and the raw k+delta fan-out, with
    /// ratios. Starts its own 10-node cluster unless --cluster is given.
    Pages(remem::bench::BenchArgs),
    /// Encode/decode nanoseconds per page of remem's codec beside Debian's ISA-L
    /// (remem-isal-baseline, a separate binary of this workspace).
    Codec(CodecArgs),
    /// Rebuild one slab of a full EC(8,2) range on a spare node (after an eviction) with reads
    /// served and checked throughout; prints the rebuild's MiB/s beside its floor (the sources
    /// read the same way, not decoded) and the CPU seconds each spent. Starts its own 11 nodes.
    Regen(remem::regen_bench::RegenArgs),
    /// `remem kv` beside Debian's memcached, driven by the memcached text protocol from
    /// outside: GET/SET latency and ops/s per scheme and value size with 1 and 32 connections
    /// (ratios to memcached), naive vs EOR transitions to EC(8,2), and reads racing a write with
    /// and without the work table's bypassing. Starts its own cluster and servers.
    Kv(remem::kv_bench::KvBenchArgs),
    /// `remem kv`'s high availability (docs/KV.md "Standby"): throughput and p50/p99 of a
    /// YCSB-like mix (Zipfian keys, 20/50/100% sets) with no standby, one-sided replication,
    /// synchronous RPC and log shipping (ratios to no standby) and the standby's CPU per million
    /// writes; for 1M and 10M items the restart, the sync of a new standby (whole chunks, per
    /// item, adaptive) and the failover time. Starts its own clusters.
    KvHa(remem::kv_ha_bench::KvHaBenchArgs),
    /// Unmodified applications (PageRank, sqlite, memcached ETC/SYS, redis) with 100%, 75% and
    /// 50% of their measured peak memory local and the rest in swap on remem EC(8,2), remem
    /// rep(2) or a swap file on the local disk, and with a memory node SIGKILLed mid-run:
    /// throughput and p50/p99 as ratios to the all-in-memory run, every run verified. Needs
    /// root and no swap on; --quick for a small run (docs/APPS.md).
    Apps(remem::apps_bench::AppsBenchArgs),
    /// `remem fs` beside a tmpfs and a local disk directory in the same run: fio 4 KiB random
    /// (qd1, qd32) and 1 MiB sequential O_DIRECT, sqlite3 WAL inserts and selects, tar of the
    /// source tree; each figure with its ratio to the local disk. Starts its own cluster
    /// (shared memory by default) and mounts; needs root for the tmpfs; --quick for a tiny run.
    Fs(remem_bench::fs_bench::FsBenchArgs),
}

#[derive(Args, Debug)]
struct UpArgs {
    /// Number of node processes.
    #[arg(long, default_value_t = 10, value_parser = remem::units::parse_count)]
    nodes: usize,
    /// Memory each node lends [default: 2GiB, or less so that all nodes fit in 80% of the
    /// host's available memory].
    #[arg(long, value_parser = remem::units::parse_positive_bytes)]
    capacity: Option<u64>,
    /// Slab size of every node.
    #[arg(long, default_value = "64MiB", value_parser = remem::units::parse_positive_bytes)]
    slab_size: u64,
    /// Nodes per failure domain (1: every node is its own domain).
    #[arg(long, default_value_t = 1, value_parser = remem::units::parse_count)]
    nodes_per_domain: usize,
    /// Directory for cluster.json, the secret and node logs.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Start the nodes with --fault-injection (for tests and benchmarks, never production).
    #[arg(long)]
    fault_injection: bool,
    /// Start the nodes with --encrypt: their TCP connections must be encrypted, so clients need
    /// --encrypt too (their Unix sockets, and shared memory, are not).
    #[arg(long)]
    encrypt: bool,
    /// Restart a node that dies, empty, on its address (clients probe it and readmit it; its
    /// slabs were rebuilt elsewhere meanwhile).
    #[arg(long)]
    restart_dead: bool,
    /// Start even when the nodes' capacities add up to more than the host's memory, or to more
    /// than 80% of what it has available (the nodes run without a resource monitor).
    #[arg(long)]
    force: bool,
    /// The nodes' --lease-grace: how long the slabs of a client that went away are kept for it
    /// to re-attach (e.g. a restarted `remem nbd`) before they are freed [default: the node's, 2m].
    #[arg(long, value_parser = remem::units::parse_duration, value_name = "DURATION")]
    lease_grace: Option<std::time::Duration>,
    /// Every node serves Prometheus metrics on 127.0.0.1 (`remem node --metrics`): node N on
    /// FIRST_PORT + N (the same ports every run, and a restarted node keeps its port), or, with
    /// no FIRST_PORT, on a free port the kernel picks. Printed, and in cluster.json (`metrics`).
    #[arg(long, value_name = "FIRST_PORT", num_args = 0..=1, default_missing_value = "0")]
    metrics: Option<u16>,
}

#[derive(Args, Debug)]
struct CodecArgs {
    #[arg(long, short = 'k', default_value_t = 8, value_parser = remem::code_args::parse_data_splits)]
    data_splits: usize,
    #[arg(long, short = 'r', default_value_t = 2, value_parser = remem::code_args::parse_parity_splits)]
    parity_splits: usize,
    #[arg(long, default_value_t = 4096)]
    page_bytes: usize,
    /// Pages coded per measurement round.
    #[arg(long, default_value_t = 200_000)]
    iterations: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() {
    let cli = parse_command_line();
    let default_level = if matches!(cli.command, Command::Node(_)) { "info" } else { "warn" };
    let filter = EnvFilter::try_from_env("REMEM_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    // Colour only on a terminal: node logs and redirected stderr stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if std::env::var("REMEM_LOG_FORMAT").is_ok_and(|format| format == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
    if let Err(error) = run(cli) {
        eprintln!("error: {}", remem::error_text(&error));
        std::process::exit(1);
    }
}

/// Parses the command line; for `remem node --config FILE`, parses it again with the file's
/// settings placed before the typed flags, so that those win (`args_override_self`).
fn parse_command_line() -> Cli {
    let cli = Cli::parse();
    let Command::Node(remem::node::NodeArgs { config: Some(path), .. }) = &cli.command else { return cli };
    let command = Cli::command();
    let node = command.find_subcommand("node").expect("node is a subcommand of remem");
    match remem::config_file::arguments_from_file(path, node) {
        Ok(arguments) => {
            let argv = std::env::args_os().collect();
            Cli::parse_from(remem::config_file::insert_after_subcommand(argv, "node", arguments))
        }
        Err(error) => {
            eprintln!("error: {}", remem::error_text(&error));
            std::process::exit(2);
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let binary = std::env::current_exe().context("locating the remem binary")?;
    match cli.command {
        Command::Node(args) => remem::node::run(args),
        Command::Up(args) => up(args, &binary),
        Command::Demo(args) => remem::demo::run(args, &binary),
        Command::Nbd(args) => remem::nbd_command::run(args),
        Command::Kv(args) => remem::kv_command::run(args),
        Command::Fs(args) => remem::fs_command::run(args),
        Command::Swap(command) => remem::swap_command::run(command, &binary),
        Command::Run(args) => remem::run_command::run(args, &binary).map(|code| {
            if code != 0 {
                std::process::exit(code);
            }
        }),
        Command::Status(args) => remem::status_command::run(args),
        Command::Sim(args) => remem::sim_command::run(args),
        Command::TortureWriter(args) => remem::torture::run(args),
        Command::MemoryHog(args) => remem::memory_hog::run(args),
        Command::Completions(args) => {
            remem::completions::write(args.shell, Cli::command(), &mut std::io::stdout().lock())
        }
        Command::Docs(args) => remem::docs_command::run(args, &mut std::io::stdout().lock()),
        Command::Man(args) => {
            for page in
                remem::manpage::write_all(remem::completions::with_value_lists(Cli::command()), &args.dir)?
            {
                println!("{}", page.display());
            }
            Ok(())
        }
        Command::Bench(BenchCommand::Pages(args)) => {
            let json = args.json;
            print_report(json, &remem::bench::run(args, &binary)?, remem::bench::print_table)
        }
        Command::Bench(BenchCommand::Regen(args)) => {
            let json = args.json;
            let report = remem::regen_bench::run(args, &binary)?;
            print_report(json, &report, remem::regen_bench::print)?;
            if report.read_mismatches > 0 {
                anyhow::bail!("{} pages read back wrong", report.read_mismatches);
            }
            Ok(())
        }
        Command::Bench(BenchCommand::Kv(args)) => {
            let json = args.json;
            print_report(json, &remem::kv_bench::run(args, &binary)?, remem::kv_bench::print_table)
        }
        Command::Bench(BenchCommand::KvHa(args)) => {
            let json = args.json;
            print_report(json, &remem::kv_ha_bench::run(args, &binary)?, remem::kv_ha_bench::print_table)
        }
        Command::Bench(BenchCommand::Apps(args)) => remem::apps_bench::run(args, &binary).map(drop),
        Command::Bench(BenchCommand::Fs(args)) => {
            let json = args.json;
            print_report(
                json,
                &remem_bench::fs_bench::run(args, &binary)?,
                remem_bench::fs_bench::print_table,
            )
        }
        Command::Bench(BenchCommand::Codec(args)) => remem::codec_bench::run(
            args.data_splits,
            args.parity_splits,
            args.page_bytes,
            args.iterations,
            args.json,
            &binary,
        ),
    }
}

/// One command of `remem up`'s standard input: `add`, `restart N`, `stop N`, `remove N` or
/// `help`.
fn up_command(
    cluster: &mut LocalCluster,
    binary: &std::path::Path,
    options: &ClusterOptions,
    line: &str,
) -> Result<()> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let node_index = |word: &str| match word.parse::<usize>() {
        Ok(index) if index < cluster.file.nodes.len() => Ok(index),
        _ => Err(anyhow::anyhow!(
            "`{}` takes a node index below {}, got {word:?}",
            words[0],
            cluster.file.nodes.len()
        )),
    };
    match words.as_slice() {
        ["add"] => cluster.add_node(binary, options).map(|index| print_node(cluster, index, "")),
        ["restart", index] => {
            let index = node_index(index)?;
            cluster.restart(binary, options, index).map(|()| print_node(cluster, index, "restarted at "))
        }
        ["stop", index] => {
            let index = node_index(index)?;
            cluster.kill(index).map(|()| {
                println!("node {index}: stopped (SIGKILL); `restart {index}` starts it again empty");
            })
        }
        ["remove", index] => {
            let index = node_index(index)?;
            let node = cluster.remove(index, Duration::from_secs(5))?;
            println!(
                "node {index}: {} stopped (SIGTERM) and removed from the cluster file; nodes after \
                 it move up one index",
                node.address
            );
            Ok(())
        }
        ["help"] => {
            println!("add        start one more node (clients that watch the cluster file take it)");
            println!("restart N  restart node N empty on its address (a replaced node)");
            println!("stop N     SIGKILL node N (a failure; it shows DOWN in `remem status`)");
            println!("remove N   stop node N (SIGTERM) and take it out of the cluster file for good");
            println!("help       this list; Ctrl-C or SIGTERM stops the cluster");
            Ok(())
        }
        [] => Ok(()),
        _ => Err(anyhow::anyhow!(
            "unknown command {line:?}: `add`, `restart N`, `stop N`, `remove N` or `help`"
        )),
    }
}

/// `node N: ADDRESS (DOMAIN) pid PID [metrics ADDRESS]`, after `what` (e.g. "restarted at ").
fn print_node(cluster: &LocalCluster, index: usize, what: &str) {
    let node = &cluster.file.nodes[index];
    let metrics =
        node.metrics.map(|address| format!(" metrics http://{address}/metrics")).unwrap_or_default();
    println!(
        "node {index}: {what}{} ({}) pid {}{metrics}",
        node.address,
        node.failure_domain,
        node.pid.unwrap_or(0)
    );
}

fn up(args: UpArgs, binary: &std::path::Path) -> Result<()> {
    let capacity_bytes =
        remem::launcher::up_capacity_bytes(args.nodes, args.capacity, args.slab_size, args.force)?;
    let options = ClusterOptions {
        lease_grace: args.lease_grace,
        nodes: args.nodes,
        capacity_bytes,
        slab_size_bytes: args.slab_size,
        nodes_per_domain: args.nodes_per_domain,
        dir: args.dir.unwrap_or_else(remem::launcher::default_dir),
        fault_injection: args.fault_injection,
        // `None` is `--no-monitor`; forced nodes skip their own host check too.
        monitor_args: args.force.then(|| vec!["--no-monitor".to_owned(), "--force".to_owned()]),
        unix_sockets: remem::launcher::UnixSockets::All,
        encrypt: args.encrypt,
    };
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    let metrics = match args.metrics {
        None => NodeMetrics::Off,
        Some(0) => NodeMetrics::AnyPort,
        Some(first) => NodeMetrics::FromPort(first),
    };
    let mut cluster = LocalCluster::start_with_metrics(binary, &options, metrics)?;
    for index in 0..cluster.file.nodes.len() {
        print_node(&cluster, index, "");
    }
    println!("cluster file: {}", cluster.cluster_file_path.display());
    println!("type `add` to start one more node, `restart N` to restart node N empty on its address,");
    println!("`stop N` to SIGKILL node N, `remove N` to stop it and take it out of the cluster file,");
    println!("`help` for these; press Ctrl-C to stop the cluster");
    std::io::Write::flush(&mut std::io::stdout())?;
    // Commands on standard input change the running cluster; clients that watch the cluster
    // file (`remem nbd`) learn of new nodes, and probe restarted ones, without a restart.
    let (commands, received) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if commands.send(line).is_err() {
                break;
            }
        }
    });
    while !stop.load(Ordering::Relaxed) {
        let line = match received.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => Some(line),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
            // Standard input is closed (a service, `< /dev/null`, a background job): no commands
            // come, and the loop only watches the nodes, at the same pace.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(Duration::from_millis(200));
                None
            }
        };
        if let Some(line) = line {
            let result = up_command(&mut cluster, binary, &options, &line);
            if let Err(error) = result {
                eprintln!("error: {error:#}");
            }
            std::io::Write::flush(&mut std::io::stdout())?;
        }
        if stop.load(Ordering::Relaxed) {
            // Nodes that exit now exit with the cluster (a signal to the whole process group).
            break;
        }
        for (index, exit) in cluster.newly_exited() {
            if !args.restart_dead {
                eprintln!("warning: {exit}; `restart {index}` starts it again on its address");
                continue;
            }
            match cluster.restart(binary, &options, index) {
                Ok(()) => eprintln!("warning: {exit}; restarted empty on its address (--restart-dead)"),
                Err(error) => {
                    eprintln!("warning: {exit}; restarting it failed: {}", remem::error_text(&error))
                }
            }
        }
    }
    eprintln!("stopping {} nodes ...", cluster.file.nodes.len());
    cluster.stop(Duration::from_secs(5));
    Ok(())
}

/// A bench's report: one JSON document with `--json`, else its tables.
fn print_report<T: serde::Serialize>(json: bool, report: &T, table: fn(&T)) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        table(report);
    }
    Ok(())
}
