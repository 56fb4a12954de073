//! `remem status`: every node of a cluster file, as the node reports itself (up or down,
//! failure domain, capacity, memory used and free, slabs, rebuilds running with their
//! progress, speed and ETA), as a table or JSON, once or every `--watch` seconds. Each node is
//! asked on its own connection (a fresh session that maps nothing), so a dead node is a row, not
//! an error; up to 16 at once, so stopped nodes, each costing the timeout, do not add up.
//! While rebuilds run, the nodes running them are asked once more, [`RATE_SAMPLE`] after their
//! first answer, for the speed that gives the ETA: `status` then takes a second longer.
//!
//! Clients' own view (regions healthy, degraded, rebuilding, lost) is not here: nodes do not
//! know it, and clients do not publish it yet (issue 14: metrics).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;

use crate::units::format_bytes;
use remem_proto::auth::Secret;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Cluster file (default: the `remem up` default directory's).
    #[arg(long, conflicts_with = "etcd")]
    pub cluster: Option<PathBuf>,
    /// List the nodes registered in etcd (`--etcd URLS`), as each last wrote its record.
    #[command(flatten)]
    pub etcd: crate::etcd_cluster::EtcdArgs,
    /// With --etcd: the cluster secret, so every registered node is asked live (as with a cluster
    /// file: a SIGKILLed node shows DOWN at once, while its record lives until its lease
    /// lapses). Without it, the nodes are listed as their records last said.
    #[arg(long, requires = "etcd", value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Print again every this many seconds until interrupted.
    #[arg(long, value_name = "SECONDS", value_parser = crate::units::parse_count)]
    pub watch: Option<usize>,
    /// How long to wait for each node.
    #[arg(long, default_value_t = 2000, value_parser = crate::units::parse_positive_ms)]
    pub timeout_ms: u64,
    /// Ask the nodes over encrypted connections (nodes started with `--encrypt` require it).
    #[arg(long)]
    pub encrypt: bool,
}

/// One node's row.
#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub index: usize,
    pub address: String,
    pub failure_domain: String,
    pub up: bool,
    /// Why the node could not be asked (down, refused, timed out).
    pub error: Option<String>,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub slab_size_bytes: u64,
    pub slabs_mapped: u32,
    pub requests_served: u64,
    pub rebuilds_running: u32,
    /// Progress of the rebuilds running on the node, 0 to 100.
    pub rebuild_percent: Option<f64>,
    /// Pages the node's rebuilds handled per second, over a second's sample ([`RATE_SAMPLE`]).
    pub rebuild_pages_per_second: Option<f64>,
    /// Seconds until the node's running rebuilds end at that rate.
    pub rebuild_eta_seconds: Option<f64>,
    /// When the node was asked, and the rebuild pages it reported done and in all: the rate's
    /// first sample.
    #[serde(skip)]
    pub rebuild_sample: Option<(std::time::Instant, u64, u64)>,
    /// Clients whose lease is live here (a process connected).
    pub clients: u32,
    /// Clients that went away, and their slabs, kept until the node's lease grace period ends.
    pub clients_in_grace: u32,
    pub slabs_in_grace: u32,
}

#[derive(Debug, Serialize)]
pub struct ClusterStatus {
    pub cluster_file: String,
    pub nodes_up: usize,
    pub nodes: Vec<NodeRow>,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub rebuilds_running: u32,
    /// What each front end's client says of its regions (`client_report`).
    pub clients: Vec<crate::client_report::ClientRow>,
}

pub fn collect(args: &StatusArgs) -> Result<ClusterStatus> {
    if let Some(etcd) = args.etcd.connect()? {
        let live = match &args.secret_file {
            Some(path) => Some((
                Secret::load(Some(path)).context("loading the cluster secret")?,
                Duration::from_millis(args.timeout_ms),
            )),
            None => None,
        };
        let live =
            live.as_ref().map(|(secret, timeout)| (secret, Ask { timeout: *timeout, encrypt: args.encrypt }));
        return crate::etcd_cluster::status(&etcd, live);
    }
    let (path, cluster, secret) = crate::launcher::load_cluster_as_it_is(args.cluster.as_deref())?;
    // Every node is shown DOWN then (exit status 4); the note says why they all are.
    if let Some(stale) = crate::launcher::stale_cluster(&path, &cluster) {
        eprintln!("note: {stale}");
    }
    let timeout = Duration::from_millis(args.timeout_ms);
    let targets: Vec<(SocketAddr, String)> =
        cluster.nodes.iter().map(|node| (node.address, node.failure_domain.clone())).collect();
    let nodes = ask_nodes(&targets, &secret, Ask { timeout, encrypt: args.encrypt || cluster.encrypt });
    Ok(ClusterStatus {
        cluster_file: path.display().to_string(),
        nodes_up: nodes.iter().filter(|node| node.up).count(),
        capacity_bytes: nodes.iter().map(|node| node.capacity_bytes).sum(),
        free_bytes: nodes.iter().map(|node| node.free_bytes).sum(),
        rebuilds_running: nodes.iter().map(|node| node.rebuilds_running).sum(),
        nodes,
        clients: crate::client_report::read_reports(&path),
    })
}

/// Asks every node of `targets` (address, failure domain as configured) for its state, each on
/// its own connection; one that cannot be asked is a DOWN row with the reason. Nodes running
/// rebuilds are asked again to tell their speed ([`sample_rebuild_rates`]).
pub fn ask_nodes(targets: &[(SocketAddr, String)], secret: &Secret, ask: Ask) -> Vec<NodeRow> {
    // Several at once: a stopped node costs the whole timeout, and a cluster may have hundreds.
    let workers = targets.len().clamp(1, MAX_QUERIES_AT_ONCE);
    let mut nodes: Vec<NodeRow> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                scope.spawn(move || {
                    let mine = targets.iter().enumerate().skip(worker).step_by(workers);
                    mine.map(|(index, (address, domain))| ask_node(index, *address, domain, secret, ask))
                        .collect::<Vec<NodeRow>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|handle| handle.join().expect("a status query panicked")).collect()
    });
    nodes.sort_by_key(|node| node.index);
    sample_rebuild_rates(&mut nodes, targets, secret, ask);
    nodes
}

/// One node's row: what it reports, or DOWN with the reason it could not be asked.
fn ask_node(index: usize, address: SocketAddr, failure_domain: &str, secret: &Secret, ask: Ask) -> NodeRow {
    let asked_at = std::time::Instant::now();
    match remem_client::query_node(address, secret, ask.timeout, ask.encrypt) {
        Ok(status) => NodeRow {
            index,
            address: address.to_string(),
            failure_domain: status.failure_domain.clone(),
            up: true,
            error: None,
            capacity_bytes: status.capacity_bytes,
            used_bytes: status.capacity_bytes.saturating_sub(status.free_bytes),
            free_bytes: status.free_bytes,
            slab_size_bytes: status.slab_size_bytes,
            slabs_mapped: status.slabs_mapped,
            requests_served: status.requests_served,
            rebuilds_running: status.regenerating_slabs,
            rebuild_percent: percent(status.regeneration_pages_done, status.regeneration_pages_total),
            rebuild_pages_per_second: None,
            rebuild_eta_seconds: None,
            rebuild_sample: (status.regenerating_slabs > 0).then_some((
                asked_at,
                status.regeneration_pages_done,
                status.regeneration_pages_total,
            )),
            clients: status.clients_live,
            clients_in_grace: status.clients_in_grace,
            slabs_in_grace: status.slabs_in_grace,
        },
        Err(error) => NodeRow {
            index,
            address: address.to_string(),
            failure_domain: failure_domain.to_owned(),
            up: false,
            error: Some(crate::error_text(&anyhow::Error::new(error))),
            capacity_bytes: 0,
            used_bytes: 0,
            free_bytes: 0,
            slab_size_bytes: 0,
            slabs_mapped: 0,
            requests_served: 0,
            rebuilds_running: 0,
            rebuild_percent: None,
            rebuild_pages_per_second: None,
            rebuild_eta_seconds: None,
            rebuild_sample: None,
            clients: 0,
            clients_in_grace: 0,
            slabs_in_grace: 0,
        },
    }
}

/// How each node is asked: the wait, and whether the connection encrypts.
#[derive(Clone, Copy, Debug)]
pub struct Ask {
    pub timeout: Duration,
    pub encrypt: bool,
}

/// Node queries `status` runs at once.
const MAX_QUERIES_AT_ONCE: usize = 16;

/// How long `status` watches running rebuilds to tell their speed and ETA.
pub const RATE_SAMPLE: Duration = Duration::from_secs(1);

fn percent(done: u64, total: u64) -> Option<f64> {
    (total > 0).then(|| 100.0 * done as f64 / total as f64)
}

/// Asks the nodes with rebuilds running again, [`RATE_SAMPLE`] after their first answer, and
/// sets their rate and ETA from the pages handled meanwhile. A node whose total changed (a
/// rebuild ended or began) gets its new progress but no rate: the two samples do not count the
/// same rebuilds.
fn sample_rebuild_rates(nodes: &mut [NodeRow], targets: &[(SocketAddr, String)], secret: &Secret, ask: Ask) {
    let first = nodes.iter().filter_map(|node| node.rebuild_sample.map(|(at, _, _)| at)).min();
    let Some(first) = first else { return };
    std::thread::sleep(RATE_SAMPLE.saturating_sub(first.elapsed()));
    for node in nodes.iter_mut() {
        let Some((asked_at, done_before, total_before)) = node.rebuild_sample else { continue };
        let Ok(status) = remem_client::query_node(targets[node.index].0, secret, ask.timeout, ask.encrypt)
        else {
            continue;
        };
        let elapsed = asked_at.elapsed().as_secs_f64();
        node.rebuilds_running = status.regenerating_slabs;
        let (done, total) = (status.regeneration_pages_done, status.regeneration_pages_total);
        node.rebuild_percent = percent(done, total);
        if total == total_before && done >= done_before && total > 0 {
            let rate = (done - done_before) as f64 / elapsed;
            node.rebuild_pages_per_second = Some(rate);
            node.rebuild_eta_seconds = (rate > 0.0).then(|| (total - done) as f64 / rate);
        }
    }
}

pub fn print_table(status: &ClusterStatus, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "cluster {}: {} of {} nodes up, {} free of {}, {} rebuilds running",
        status.cluster_file,
        status.nodes_up,
        status.nodes.len(),
        format_bytes(status.free_bytes),
        format_bytes(status.capacity_bytes),
        status.rebuilds_running
    )?;
    writeln!(
        out,
        "{:>4}  {:<22} {:<12} {:<5} {:>12} {:>12} {:>12} {:>6} {:>22} {:>7}  in grace",
        "node", "address", "domain", "state", "capacity", "used", "free", "slabs", "rebuilds", "clients"
    )?;
    for node in &status.nodes {
        if !node.up {
            writeln!(
                out,
                "{:>4}  {:<22} {:<12} {:<5} {}",
                node.index,
                node.address,
                node.failure_domain,
                "DOWN",
                node.error.as_deref().unwrap_or("")
            )?;
            continue;
        }
        let rebuilds = match (node.rebuild_percent, node.rebuild_eta_seconds) {
            (Some(percent), Some(eta)) => {
                format!("{} ({percent:.0}%, ETA {eta:.0} s)", node.rebuilds_running)
            }
            (Some(percent), None) => format!("{} ({percent:.0}%)", node.rebuilds_running),
            (None, _) => node.rebuilds_running.to_string(),
        };
        let in_grace = match node.clients_in_grace {
            0 => "-".to_owned(),
            clients => format!("{clients} ({} slabs)", node.slabs_in_grace),
        };
        writeln!(
            out,
            "{:>4}  {:<22} {:<12} {:<5} {:>12} {:>12} {:>12} {:>6} {:>22} {:>7}  {}",
            node.index,
            node.address,
            node.failure_domain,
            "up",
            format_bytes(node.capacity_bytes),
            format_bytes(node.used_bytes),
            format_bytes(node.free_bytes),
            node.slabs_mapped,
            rebuilds,
            node.clients,
            in_grace
        )?;
    }
    if !status.clients.is_empty() {
        writeln!(out, "clients (their own account of their regions):")?;
    }
    for client in &status.clients {
        let report = &client.report;
        let state = if client.alive {
            format!("updated {:.0} s ago", client.age_secs)
        } else {
            format!(
                "process gone (last report {:.0} s ago): its slabs wait out the nodes' lease grace",
                client.age_secs
            )
        };
        writeln!(
            out,
            "  {} {} (pid {}, client {}): {state}",
            report.front_end, report.name, report.pid, report.client_id
        )?;
        if client.alive {
            for region in &report.regions {
                writeln!(out, "    {}", crate::client_report::describe_region(region))?;
            }
        }
    }
    Ok(())
}

/// The exit status of one `remem status` (in its --help): 0 every node up, 3 some down
/// (degraded), 4 every node down or none listed; 1 is an error of the command itself.
pub fn exit_code(status: &ClusterStatus) -> i32 {
    if status.nodes_up == 0 {
        4
    } else if status.nodes_up < status.nodes.len() {
        3
    } else {
        0
    }
}

pub fn run(args: StatusArgs) -> Result<()> {
    loop {
        let status = collect(&args)?;
        let mut stdout = std::io::stdout().lock();
        if args.json {
            writeln!(stdout, "{}", serde_json::to_string_pretty(&status)?)?;
        } else {
            print_table(&status, &mut stdout)?;
        }
        stdout.flush()?;
        match args.watch {
            Some(seconds) => std::thread::sleep(Duration::from_secs(seconds as u64)),
            None => match exit_code(&status) {
                0 => return Ok(()),
                code => std::process::exit(code),
            },
        }
    }
}
