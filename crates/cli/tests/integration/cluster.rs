//! End-to-end tests on real `remem node` processes on 127.0.0.1: pages written through the
//! client are read back byte for byte, through EC, replication and no redundancy, with nodes
//! killed by SIGKILL. Every test bounds its time and stops the processes it started.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use remem::launcher::{ClusterOptions, LocalCluster};
use remem::pattern;
use remem_client::{Client, ClientConfig, PageError, PageOp, Shape};
use remem_placement::LeastLoaded;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("remem-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn start_cluster(name: &str, nodes: usize, slab_size_bytes: u64) -> LocalCluster {
    let options = ClusterOptions {
        lease_grace: None,
        nodes,
        capacity_bytes: 64 * slab_size_bytes,
        slab_size_bytes,
        nodes_per_domain: 1,
        dir: test_dir(name),
        fault_injection: false,
        monitor_args: None,
        unix_sockets: remem::launcher::UnixSockets::All,
        encrypt: false,
    };
    let mut cluster = LocalCluster::start(binary(), &options).expect("cluster starts");
    cluster.remove_dir_on_drop();
    cluster
}

fn connect(cluster: &LocalCluster, shape: Shape, bytes: u64) -> Client {
    let mut config = ClientConfig::new(shape, bytes);
    config.request_timeout = Duration::from_secs(5);
    Client::connect(
        &cluster.addresses(),
        &cluster.secret,
        config,
        Box::new(LeastLoaded::new(StdRng::seed_from_u64(3))),
    )
    .expect("client connects")
}

/// Writes pages `pages` with generation `generation`, 32 in flight; panics on any error.
fn write_pages(client: &mut Client, pages: &[u64], generation: u64) {
    let buffers: Vec<Vec<u8>> = pages
        .iter()
        .map(|&page| {
            let mut buffer = vec![0; 4096];
            pattern::fill(&mut buffer, page, generation, 11);
            buffer
        })
        .collect();
    let mut ops: Vec<PageOp<'_>> =
        pages.iter().zip(&buffers).map(|(&page, data)| PageOp::Write { page, data }).collect();
    let mut errors = Vec::new();
    client.execute(&mut ops, |done| {
        if let Err(error) = done.result {
            errors.push(error.to_string());
        }
    });
    assert!(errors.is_empty(), "write errors: {errors:?}");
}

/// Reads `pages` and returns, per page, the read result; checks bytes of successful reads
/// against `generation` and counts decodes.
fn read_pages(client: &mut Client, pages: &[u64], generation: u64) -> (Vec<Result<(), String>>, usize) {
    let mut buffers = vec![vec![0u8; 4096]; pages.len()];
    let mut results: Vec<Result<(), String>> = vec![Ok(()); pages.len()];
    let mut decoded = 0;
    {
        let mut ops: Vec<PageOp<'_>> =
            pages.iter().zip(buffers.iter_mut()).map(|(&page, buf)| PageOp::Read { page, buf }).collect();
        client.execute(&mut ops, |done| {
            decoded += done.decoded as usize;
            results[done.index] = done.result.map_err(|error| error.to_string());
        });
    }
    let mut scratch = vec![0; 4096];
    for ((page, buffer), result) in pages.iter().zip(&buffers).zip(&results) {
        if result.is_ok() {
            assert!(
                pattern::check(buffer, *page, generation, 11, &mut scratch),
                "page {page} read back wrong"
            );
        }
    }
    (results, decoded)
}

const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };

#[test]
fn pages_round_trip_ec82_on_ten_node_processes() {
    let cluster = start_cluster("roundtrip", 10, 1 << 20);
    // 1 MiB slabs hold 2048 splits of 512 B: 4096 pages span two ranges.
    let mut client = connect(&cluster, EC82, 4096 * 4096);
    assert_eq!(client.ranges().len(), 2);
    for range in client.ranges() {
        let mut nodes: Vec<usize> = range.slabs.iter().map(|slab| slab.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        assert_eq!(nodes.len(), 10, "a range's slabs are on distinct nodes");
    }
    let pages: Vec<u64> = (0..4096).collect();
    write_pages(&mut client, &pages, 1);
    let (results, mut decoded) = read_pages(&mut client, &pages, 1);
    assert!(results.iter().all(Result::is_ok));
    // Healthy nodes: the data splits usually come first, so most reads do not decode. A node
    // starved of CPU for a whole pass (a loaded machine) makes every read of one pass decode:
    // up to three passes, one of which must read some page from its data splits alone.
    for _ in 0..2 {
        if decoded < pages.len() {
            break;
        }
        let (results, again) = read_pages(&mut client, &pages, 1);
        assert!(results.iter().all(Result::is_ok));
        decoded = again;
    }
    assert!(
        decoded < pages.len(),
        "every read of three passes decoded: late binding is not preferring data splits"
    );

    // Overwrite every other page; old and new generations must both read back exactly.
    let odd: Vec<u64> = pages.iter().copied().filter(|page| page % 2 == 1).collect();
    let even: Vec<u64> = pages.iter().copied().filter(|page| page % 2 == 0).collect();
    write_pages(&mut client, &odd, 2);
    assert!(read_pages(&mut client, &odd, 2).0.iter().all(Result::is_ok));
    assert!(read_pages(&mut client, &even, 1).0.iter().all(Result::is_ok));

    // One page at a time (queue depth 1) through the simple API.
    let mut page = vec![0u8; 4096];
    pattern::fill(&mut page, 77, 9, 11);
    client.write_page(77, &page).unwrap();
    let mut back = vec![0u8; 4096];
    client.read_page(77, &mut back).unwrap();
    assert_eq!(page, back);
    // A page never written reads as zeros.
    let mut fresh = vec![0u8; 4096];
    let mut client2 = connect(&cluster, EC82, 4096 * 16);
    client2.read_page(3, &mut fresh).unwrap();
    assert!(fresh.iter().all(|&byte| byte == 0));
}

#[test]
fn replication_and_no_redundancy_share_the_code_path() {
    let cluster = start_cluster("schemes", 4, 1 << 20);
    for shape in [
        Shape { data_splits: 1, parity_splits: 1, extra_reads: 0 },
        Shape { data_splits: 1, parity_splits: 2, extra_reads: 1 },
        Shape { data_splits: 1, parity_splits: 0, extra_reads: 0 },
        Shape { data_splits: 2, parity_splits: 2, extra_reads: 2 },
        Shape { data_splits: 4, parity_splits: 0, extra_reads: 0 },
    ] {
        let mut client = connect(&cluster, shape, 600 * 4096);
        let pages: Vec<u64> = (0..600).collect();
        write_pages(&mut client, &pages, 5);
        let (results, _) = read_pages(&mut client, &pages, 5);
        assert!(results.iter().all(Result::is_ok), "{shape:?}: {:?}", results.iter().find(|r| r.is_err()));
        client.release().unwrap();
    }
}

#[test]
fn read_survives_two_killed_nodes_k8_r2_and_errors_at_three() {
    let mut cluster = start_cluster("kill", 10, 1 << 20);
    let mut client = connect(&cluster, EC82, 2048 * 4096);
    let pages: Vec<u64> = (0..2048).collect();
    write_pages(&mut client, &pages, 3);
    let nodes = client.ranges()[0].slabs.iter().map(|slab| slab.node).collect::<Vec<_>>();

    // Kill the nodes of two data splits: every page must decode from the parities.
    cluster.kill(nodes[0]).unwrap();
    cluster.kill(nodes[5]).unwrap();
    let (results, decoded) = read_pages(&mut client, &pages, 3);
    assert!(results.iter().all(Result::is_ok), "{:?}", results.iter().find(|r| r.is_err()));
    assert_eq!(decoded, pages.len(), "with two data splits gone every read decodes");
    // Writes still succeed, degraded, and read back.
    write_pages(&mut client, &pages[..512], 4);
    assert!(read_pages(&mut client, &pages[..512], 4).0.iter().all(Result::is_ok));

    // A third failure is beyond r: errors that name the range, never wrong data.
    cluster.kill(nodes[9]).unwrap();
    let (results, _) = read_pages(&mut client, &pages[..64], 4);
    for result in &results {
        let error = result.as_ref().expect_err("r+1 failures cannot read");
        assert!(error.contains("range 0") && error.contains("unreadable"), "{error}");
    }
    let mut page = vec![0u8; 4096];
    match client.write_page(1, &page) {
        Err(PageError::WriteFailed { range: 0, .. }) => {}
        other => panic!("write with r+1 nodes down: {other:?}"),
    }
    assert!(client.read_page(1, &mut page).is_err());
}

#[test]
fn wrong_secret_is_refused() {
    let cluster = start_cluster("secret", 2, 1 << 20);
    let secret = remem_proto::auth::Secret::from_bytes(b"not the cluster secret at all".to_vec()).unwrap();
    let config = ClientConfig::new(Shape { data_splits: 1, parity_splits: 1, extra_reads: 0 }, 1 << 20);
    let result = Client::connect(
        &cluster.addresses(),
        &secret,
        config,
        Box::new(LeastLoaded::new(StdRng::seed_from_u64(1))),
    );
    let error = result.err().expect("a client without the secret is refused").to_string();
    assert!(error.contains("handshake"), "{error}");
}

#[test]
fn nodes_stop_cleanly_on_sigterm() {
    let mut cluster = start_cluster("sigterm", 3, 1 << 20);
    let pids: Vec<u32> = (0..3).map(|node| cluster.pid(node).unwrap()).collect();
    cluster.stop(Duration::from_secs(5));
    for pid in pids {
        // SAFETY: signal 0 only checks existence; the processes were reaped by stop().
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
        assert!(!alive, "node {pid} still runs after stop");
    }
}

fn start_cluster_in_domains(name: &str, nodes: usize, nodes_per_domain: usize) -> LocalCluster {
    let options = ClusterOptions {
        lease_grace: None,
        nodes,
        capacity_bytes: 16 << 20,
        slab_size_bytes: 1 << 20,
        nodes_per_domain,
        dir: test_dir(name),
        fault_injection: false,
        monitor_args: None,
        unix_sockets: remem::launcher::UnixSockets::None,
        encrypt: false,
    };
    let mut cluster = LocalCluster::start(binary(), &options).expect("cluster starts");
    cluster.remove_dir_on_drop();
    cluster
}

/// 12 nodes in 3 failure domains (hosts) cannot hold EC(8,2) with at most r = 2 splits of a
/// range per domain: one lost host would lose data. The client refuses and names what fits
/// (EC(4,2): 3 domains x 2); `allow_shared_domains` accepts the risk. In 6 domains of 2 nodes
/// every range keeps at most 2 splits per domain.
#[test]
fn placement_keeps_at_most_r_splits_per_failure_domain_or_refuses_naming_what_fits() {
    let shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
    let bytes = 8 << 20;
    let three = start_cluster_in_domains("domains-3", 12, 4);
    let placement = || Box::new(LeastLoaded::new(StdRng::seed_from_u64(5)));
    let config = ClientConfig::new(shape, bytes);
    let refused = Client::connect(&three.addresses(), &three.secret, config.clone(), placement());
    let message = refused.err().expect("EC(8,2) on 3 domains is refused").to_string();
    assert!(message.contains("failure domain") && message.contains("-k 4 -r 2"), "{message}");
    let mut allowed = config.clone();
    allowed.allow_shared_domains = true;
    let client = Client::connect(&three.addresses(), &three.secret, allowed, placement())
        .expect("allowed with --allow-shared-domains");
    drop(client);
    drop(three);

    let six = start_cluster_in_domains("domains-6", 12, 2);
    let mut client =
        Client::connect(&six.addresses(), &six.secret, config, placement()).expect("6 domains fit");
    for range in 0..client.ranges().len() {
        let mut per_domain = std::collections::HashMap::new();
        for node in client.range_nodes(range) {
            *per_domain.entry(six.file.nodes[node].failure_domain.clone()).or_insert(0) += 1;
        }
        assert!(per_domain.values().all(|&splits| splits <= 2), "range {range}: {per_domain:?}");
    }
    write_pages(&mut client, &[0, 1, 2], 1);
}
