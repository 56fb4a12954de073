//! etcd across "hosts" (issue 15 items 1 and 2 together): etcd in its own network namespace,
//! six node hosts of two nodes each registering there over the bridge, and two client hosts.
//! A front end's client is opened on client host A the way `remem nbd --etcd` opens it (claim
//! the export, connect to the nodes found in etcd, save the slab map there) and writes every
//! page; then it stops and the same export is opened on client host B, another address, with
//! nothing local carried over: it finds its slab map in etcd, re-attaches to its slabs and reads
//! every byte back. A node host is then cut off while host B's client rewrites every page: its
//! slabs are rebuilt elsewhere, its nodes' records lapse in etcd (they cannot renew their
//! leases), and after healing every byte still verifies. Bounded; logs stay in the test
//! directory when it fails.

use crate::common;
use crate::etcd_support;
use crate::netns_support as netns;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::Model;
use netns::Net;
use rand::rngs::StdRng;
use rand::SeedableRng;
use remem::etcd_cluster::{open_export, EtcdExportRequest, ExportHome};
use remem_client::{Client, ClientConfig, MembershipChange, Shape};
use remem_placement::{CodingSets, GroupChoice};

const NODE_HOSTS: usize = 6;
const CLIENT_A: usize = NODE_HOSTS;
const CLIENT_B: usize = NODE_HOSTS + 1;
const ETCD_HOST: usize = NODE_HOSTS + 2;
const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
/// Two EC(8,2) ranges on 1 MiB slabs (512-byte splits).
const PAGES: u64 = 2 * 2048;

/// The registered node keys, as etcdctl in the etcd host lists them.
fn registered(net: &Net, url: &str) -> Vec<String> {
    netns::registered_keys(net, ETCD_HOST, url)
}

/// Opens the export `multihost` from inside the current host, as `remem nbd --etcd` does.
fn open(url: &str, secret: &remem_client::Secret) -> (Client, remem::etcd_cluster::EtcdHome) {
    let etcd =
        remem_etcd::Etcd::new(remem_etcd::EtcdConfig::new(vec![url.to_owned()], "/remem/")).expect("etcd");
    let mut config = ClientConfig::new(EC82, PAGES * 4096);
    config.release_on_drop = false;
    config.request_timeout = Duration::from_secs(2);
    open_export(EtcdExportRequest {
        etcd,
        export: "multihost",
        secret,
        config,
        fresh: false,
        placement: Box::new(CodingSets::new(StdRng::seed_from_u64(15), 2, GroupChoice::PowerOfTwo)),
    })
    .expect("the export opens from etcd")
}

/// Runs background work (and takes nodes new in etcd) until `done` holds or `limit` passes.
fn idle_until(
    client: &mut Client,
    home: &mut dyn ExportHome,
    limit: Duration,
    mut done: impl FnMut(&Client) -> bool,
) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        for node in home.new_nodes() {
            let address = node.address;
            client.apply(&MembershipChange::Added(node)).expect("a node joins");
            home.joined(address);
        }
        if done(client) {
            return true;
        }
        client.poll_background(Duration::from_millis(50));
    }
    done(client)
}

#[test]
fn a_client_restarted_on_another_host_finds_its_map_in_etcd_and_every_byte_through_a_partition() {
    let net = Net::new(NODE_HOSTS + 3, &[]);
    let dir: PathBuf = std::env::temp_dir().join(format!("remem-netns-etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    let secret_path = etcd_support::write_secret(&dir);
    let secret = remem_client::Secret::load(Some(&secret_path)).expect("secret");

    // etcd on its own host.
    let url = netns::start_etcd(&net, ETCD_HOST, &dir);
    // Two nodes per node host, each listening on its host's address and registering in etcd.
    let mut nodes: Vec<(usize, SocketAddr, u32)> = Vec::new();
    for host in 0..NODE_HOSTS {
        for port in [7100, 7101] {
            let address = SocketAddr::from((net.address(host), port));
            let mut args = netns::node_args(address, "8MiB", "1MiB", host, &secret_path);
            // Leases of 3 s, not 10: the cut-off nodes' records lapse sooner.
            args.extend([
                "--etcd".to_owned(),
                url.clone(),
                "--etcd-lease-seconds".to_owned(),
                "3".to_owned(),
            ]);
            let log = dir.join(format!("node-{}.log", nodes.len()));
            let pid = netns::spawn_node(&net, host, address, &args, &log);
            nodes.push((host, address, pid));
        }
    }
    let all_registered =
        etcd_support::wait_for(Duration::from_secs(20), || registered(&net, &url).len() == 12);
    assert!(all_registered, "registered: {:?}", registered(&net, &url));

    // Host A writes every page, then stops (its slabs stay: release_on_drop is off).
    let started = Instant::now();
    let mut model = net.run_in(CLIENT_A, || {
        let (mut client, home) = open(&url, &secret);
        let mut model = Model::default();
        let pages: Vec<u64> = (0..PAGES).collect();
        for chunk in pages.chunks(512) {
            model.write(&mut client, chunk);
        }
        drop(client);
        drop(home);
        model
    });
    eprintln!(
        "host A opened the export through etcd and wrote {PAGES} pages in {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // Host B: another address, nothing local from A. Faults come from a thread outside every
    // namespace (the `ip` commands must run in the root one).
    let (to_faults, faults) = std::sync::mpsc::channel::<Option<usize>>();
    let (to_client, fault_done) = std::sync::mpsc::channel::<()>();
    let (net, nodes, url) = (&net, &nodes, &url);
    std::thread::scope(|scope| {
        // Each message about a host cuts it off, the next one heals it.
        scope.spawn(move || {
            let mut cut = Vec::new();
            while let Ok(Some(host)) = faults.recv() {
                if let Some(at) = cut.iter().position(|&other| other == host) {
                    net.heal(host);
                    cut.remove(at);
                } else {
                    net.partition(host);
                    cut.push(host);
                }
                let _ = to_client.send(());
            }
        });
        net.run_in(CLIENT_B, move || {
            let started = Instant::now();
            let (mut client, mut home) = open(url, &secret);
            let pages: Vec<u64> = (0..PAGES).collect();
            for chunk in pages.chunks(512) {
                model.read(&mut client, chunk);
            }
            assert_eq!((model.verified, model.mismatches), (PAGES, 0), "host B reads every byte A wrote");
            eprintln!(
                "host B reopened the map from etcd and verified all {PAGES} pages in {:.2} s",
                started.elapsed().as_secs_f64()
            );

            // Cut off the node host holding most of range 0: its slabs are rebuilt on the others.
            let addresses: Vec<SocketAddr> = client.node_addresses().collect();
            let host_of = |id: usize| nodes.iter().find(|node| node.1 == addresses[id]).map(|node| node.0);
            let mut count = [0usize; NODE_HOSTS];
            for slab in &client.ranges()[0].slabs {
                if let Some(host) = host_of(slab.node) {
                    count[host] += 1;
                }
            }
            let victim = (0..NODE_HOSTS).max_by_key(|&host| count[host]).expect("a host");
            to_faults.send(Some(victim)).expect("the fault thread waits");
            fault_done.recv_timeout(Duration::from_secs(10)).expect("partitioned");
            let partitioned = Instant::now();
            for chunk in pages.chunks(512) {
                model.write(&mut client, chunk);
            }
            let moved = idle_until(&mut client, &mut home, Duration::from_secs(60), |client| {
                client.ranges().iter().all(|range| {
                    range.unavailable == 0
                        && range.slabs.iter().all(|slab| host_of(slab.node) != Some(victim))
                })
            });
            assert!(moved, "host {victim}'s slabs were not rebuilt elsewhere");
            eprintln!(
                "host {victim} partitioned: every page rewritten and its slabs rebuilt elsewhere in {:.2} s",
                partitioned.elapsed().as_secs_f64()
            );
            let lapsed = etcd_support::wait_for(Duration::from_secs(20), || registered(net, url).len() == 10);
            assert!(lapsed, "the cut-off nodes' records stayed: {:?}", registered(net, url));
            to_faults.send(Some(victim)).expect("the fault thread waits");
            fault_done.recv_timeout(Duration::from_secs(10)).expect("healed");
            let (verified, mismatches) = (model.verified, model.mismatches);
            for chunk in pages.chunks(512) {
                model.read(&mut client, chunk);
            }
            assert_eq!((model.verified - verified, model.mismatches - mismatches), (PAGES, 0));
            home.save_map(&client.slab_map()).expect("the map is saved to etcd");
            assert!(home.fenced().is_none(), "fenced: {:?}", home.fenced());
            to_faults.send(None).expect("the fault thread ends");
        });
    });
    let exited = net.exited();
    assert!(exited.is_empty(), "node or etcd processes exited: {exited:?}; logs in {}", dir.display());
    let _ = std::fs::remove_dir_all(&dir);
}
