//! Starting with nodes down (issue 14, item 3): a client, `remem kv` and `remem nbd` start while
//! up to r nodes of the cluster are dead (SIGKILL: connections refused) or hung (SIGSTOP: TCP
//! accepted, the handshake never answered), with real node processes. The nodes that do not
//! answer join as failed nodes: no new slab goes there, they are probed, and a node restarted on
//! its address is readmitted and takes slabs again. With fewer than k+r nodes answering, connect
//! fails and names every unreachable node and why.
//!
//! Nodes are connected to at once, so hung nodes cost the connect timeout (5 s) once, not once
//! each. Every wait is bounded. A stopped node is killed by the test (it would sit out the
//! cluster's SIGTERM grace).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use std::time::{Duration, Instant};

use common::{run_ok, Model};
use rand::rngs::StdRng;
use rand::SeedableRng;
use remem::kv_bench::{StoreOutcome, TextClient};
use remem::launcher::{ClusterOptions, LocalCluster, UnixSockets};
use remem_client::{Client, ClientConfig, ConnectError, Shape};
use remem_placement::LeastLoaded;

const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
/// Pages of one EC(8,2) range on 1 MiB slabs.
const RANGE_PAGES: u64 = 2048;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// `nodes` nodes of 32 slabs of 1 MiB, one failure domain each, in a fresh directory.
fn options(name: &str, nodes: usize) -> ClusterOptions {
    let dir = std::env::temp_dir().join(format!("remem-degraded-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    ClusterOptions {
        lease_grace: None,
        nodes,
        capacity_bytes: 32 * common::SLAB_BYTES,
        slab_size_bytes: common::SLAB_BYTES,
        nodes_per_domain: 1,
        dir,
        fault_injection: false,
        monitor_args: None,
        unix_sockets: UnixSockets::None,
        encrypt: false,
    }
}

/// EC(8,2) over `pages` pages, the default connect timeout (5 s); a node silent for 1 s is
/// declared failed. Slabs are not unmapped on drop: the cluster goes with the client.
fn config(pages: u64) -> ClientConfig {
    let mut config = ClientConfig::new(EC82, pages * 4096);
    config.request_timeout = Duration::from_millis(1000);
    config.release_on_drop = false;
    config
}

fn connect(cluster: &LocalCluster, config: ClientConfig) -> Result<Client, ConnectError> {
    let placement = Box::new(LeastLoaded::new(StdRng::seed_from_u64(14)));
    Client::connect(&cluster.addresses(), &cluster.secret, config, placement)
}

fn nodes_of_ranges(client: &Client) -> Vec<usize> {
    client.ranges().iter().flat_map(|range| range.slabs.iter().map(|slab| slab.node)).collect()
}

/// Calls `poll_background` like an idle application until `done` or `limit` passes.
fn idle_until(client: &mut Client, limit: Duration, mut done: impl FnMut(&Client) -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done(client) {
        if Instant::now() >= deadline {
            return false;
        }
        client.poll_background(Duration::from_millis(100));
    }
    true
}

#[test]
fn client_starts_with_two_of_twelve_nodes_killed_ec82_and_readmits_a_restarted_one() {
    let options = options("killed", 12);
    let mut cluster = LocalCluster::start(binary(), &options).expect("cluster starts");
    let dead = [3, 7];
    for node in dead {
        cluster.kill(node).unwrap();
    }
    let started = Instant::now();
    let mut client = connect(&cluster, config(RANGE_PAGES)).expect("connects with r nodes dead");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "refused connections cost nothing: connect took {took:?}");
    let used = nodes_of_ranges(&client);
    assert!(dead.iter().all(|node| !used.contains(node)), "no slab on a dead node: {used:?}");
    assert!(dead.iter().all(|&node| !client.engine().node(node).connected));

    let pages: Vec<u64> = (0..RANGE_PAGES).collect();
    let mut model = Model::default();
    model.write(&mut client, &pages);
    model.read(&mut client, &pages);

    // Node 3 comes back empty on its address: probed, readmitted, and the only spare.
    cluster.restart(binary(), &options, 3).unwrap();
    let readmitted =
        idle_until(&mut client, Duration::from_secs(10), |client| client.engine().node(3).connected);
    assert!(readmitted, "node 3, restarted, was not readmitted within 10 s");
    let victim = client.range_nodes(0)[0];
    cluster.kill(victim).unwrap();
    let noticed = idle_until(&mut client, Duration::from_secs(10), |client| {
        client.ranges()[0].unavailable != 0 || !client.range_nodes(0).contains(&victim)
    });
    assert!(noticed, "the client noticed node {victim} died");
    assert!(client.wait_for_regenerations(Duration::from_secs(30)), "the lost slab was rebuilt");
    assert!(client.range_nodes(0).contains(&3), "the readmitted node took the rebuilt slab");
    model.read(&mut client, &pages);
    model.write(&mut client, &pages[..256]);
    model.read(&mut client, &pages);
}

#[test]
fn client_starts_with_two_stopped_nodes_in_one_connect_timeout_ec82() {
    let mut cluster = common::start_cluster("degraded", "stopped", 12, UnixSockets::None);
    let hung = [2, 9];
    for node in hung {
        cluster.signal(node, libc::SIGSTOP).unwrap();
    }
    let started = Instant::now();
    let connected = connect(&cluster, config(RANGE_PAGES));
    let took = started.elapsed();
    let result = connected.map(|mut client| {
        let used = nodes_of_ranges(&client);
        assert!(hung.iter().all(|node| !used.contains(node)), "no slab on a hung node: {used:?}");
        let pages: Vec<u64> = (0..RANGE_PAGES).collect();
        let mut model = Model::default();
        model.write(&mut client, &pages);
        model.read(&mut client, &pages);
    });
    for node in hung {
        cluster.kill(node).unwrap();
    }
    result.expect("connects with r nodes hung");
    // One 5 s connect timeout for both hung nodes, not one each.
    assert!(took < Duration::from_secs(8), "connect took {took:?}");
}

#[test]
fn connect_fails_naming_the_unreachable_node_when_fewer_than_k_plus_r_answer() {
    let mut cluster = common::start_cluster("degraded", "too-few", 10, UnixSockets::None);
    cluster.kill(4).unwrap();
    let dead = cluster.addresses()[4].address;
    let error = connect(&cluster, config(RANGE_PAGES)).err().expect("9 nodes cannot hold EC(8,2)");
    let text = error.to_string();
    match &error {
        ConnectError::TooFewReachable { needed: 10, reachable: 9, unreachable } => {
            assert_eq!(unreachable.len(), 1, "{text}");
            assert_eq!(unreachable[0].address, dead, "{text}");
        }
        other => panic!("expected TooFewReachable, got {other:?}"),
    }
    assert!(text.contains(&dead.to_string()) && text.contains("refused"), "{text}");
}

fn log_path(cluster: &LocalCluster, name: &str) -> PathBuf {
    cluster.cluster_file_path.parent().expect("the cluster file is in a directory").join(name)
}

/// A front end started with `remem ARGS --cluster FILE --listen 127.0.0.1:0`, killed on drop.
struct FrontEnd {
    child: Child,
    address: String,
}

impl FrontEnd {
    /// Starts it and waits (up to 30 s) for its first stdout line, `listening ADDRESS`.
    fn start(cluster: &LocalCluster, args: &[&str], log: PathBuf) -> FrontEnd {
        let mut command = Command::new(binary());
        command.args(args).arg("--cluster").arg(&cluster.cluster_file_path).args(["--listen", "127.0.0.1:0"]);
        let (mut child, line) = common::spawn_with_first_line(command, &log);
        let Some(address) = line.trim().strip_prefix("listening ").map(str::to_owned) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "remem {args:?} did not start: {line:?}; log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        FrontEnd { child, address }
    }
}

impl Drop for FrontEnd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn remem_kv_starts_with_a_node_killed_ec82() {
    let mut cluster = common::start_cluster("degraded", "kv", 11, UnixSockets::None);
    cluster.kill(0).unwrap();
    let log = log_path(&cluster, "kv.log");
    let server = FrontEnd::start(&cluster, &["kv", "--scheme", "ec8+2", "-m", "16MiB"], log);
    let address = server.address.parse().expect("an address");
    let mut client = TextClient::connect(address, Duration::from_secs(10)).expect("connects to remem kv");
    let value: Vec<u8> = (0..65_536u32).map(|byte| (byte * 7 % 251) as u8).collect();
    for key in ["alpha", "beta", "gamma"] {
        assert!(matches!(client.set(key, &value), Ok(StoreOutcome::Stored)), "set {key}");
    }
    for key in ["alpha", "beta", "gamma"] {
        assert_eq!(client.get(key).expect("get").as_deref(), Some(&value[..]), "get {key}");
    }
}

#[test]
fn remem_nbd_starts_with_a_node_killed_ec82() {
    let mut cluster = common::start_cluster("degraded", "nbd", 11, UnixSockets::None);
    cluster.kill(0).unwrap();
    let log = log_path(&cluster, "nbd.log");
    let args = ["nbd", "--size", "8MiB", "--export", "test", "-k", "8", "-r", "2", "--delta", "1"];
    let server = FrontEnd::start(&cluster, &args, log);
    let uri = format!("nbd://{}/test", server.address);
    run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x5a 0 1M", "-c", "write -P 0xa5 7M 1M"]);
    let checked =
        run_ok(30, "qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x5a 0 1M", "-c", "read -P 0xa5 7M 1M"]);
    assert!(!checked.contains("Pattern verification failed"), "{checked}");
}
