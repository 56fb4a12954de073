//! Multi-host tests on one machine (issue 15 item 2): real node processes in six "host" network
//! namespaces, two nodes and one failure domain per host, and the client in a seventh, all joined
//! by a private bridge (tests/common/netns.rs, docs/MULTIHOST.md). Every node listens only on its
//! host's address; every byte goes through a real network stack between namespaces, and the
//! faults are network faults: a host's link delayed with jitter, lossy, cut and healed, or a whole
//! host (failure domain) killed.
//!
//! The client is this test process: a thread moved into the client namespace runs a
//! `remem_client::Client` and checks every page it reads against a model (page -> generation
//! written, contents a pattern of both). Placement is CodingSets (power-of-two group choice, l=2),
//! so with 12 nodes an EC(8,2) range takes 10 of them, spread over the 6 domains, and has 2 spares
//! to be rebuilt on. Every wait is bounded; latencies are printed, never asserted.

use crate::netns_support as netns;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use netns::{Impairment, Net};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem::pattern;
use remem_client::cluster::{ClusterFile, ClusterNode};
use remem_client::{Client, ClientConfig, NodeAddress, PageOp, Shape};
use remem_placement::{CodingSets, GroupChoice};
use remem_proto::auth::Secret;

const NODE_HOSTS: usize = 6;
const NODES_PER_HOST: usize = 2;
/// The namespace after the node hosts holds the client.
const CLIENT_HOST: usize = NODE_HOSTS;
const SLAB_BYTES: u64 = 1 << 20;
const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
const REP2: Shape = Shape { data_splits: 1, parity_splits: 1, extra_reads: 0 };
/// Pages of one EC(8,2) range on 1 MiB slabs (512-byte splits).
const EC_RANGE_PAGES: u64 = 2048;
const PATTERN_SEED: u64 = 0x15_0002;
const PAGE_BYTES: usize = 4096;
const BATCH_PAGES: usize = 256;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// One `remem node` process; its index in [`Cluster::nodes`] is its node id in the client.
struct NodeProcess {
    host: usize,
    address: SocketAddr,
    pid: u32,
}

/// The net, the nodes on its hosts and the cluster file that names them.
struct Cluster {
    net: Net,
    dir: PathBuf,
    secret: Secret,
    nodes: Vec<NodeProcess>,
}

impl Cluster {
    /// Makes the net (hosts in `impairable` can be delayed and made lossy) and starts two nodes
    /// on each node host, port 7100 and 7101 of its address, failure domain `host-I`; writes the
    /// secret and the cluster file into a private directory.
    fn start(test: &str, impairable: &[usize]) -> Cluster {
        let net = Net::new(NODE_HOSTS + 1, impairable);
        let dir = std::env::temp_dir().join(format!("remem-netns-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        remem::launcher::private_directory(&dir).expect("private test directory");
        let secret_hex: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
        let secret_file = dir.join("secret");
        remem::launcher::write_private_file(&secret_file, secret_hex.as_bytes()).expect("secret file");
        let secret = Secret::from_bytes(secret_hex.into_bytes()).expect("32-byte secret");
        let mut nodes = Vec::new();
        for host in 0..NODE_HOSTS {
            for port in [7100, 7101].into_iter().take(NODES_PER_HOST) {
                let address = SocketAddr::from((net.address(host), port));
                let args = netns::node_args(address, "48MiB", &SLAB_BYTES.to_string(), host, &secret_file);
                let log = dir.join(format!("node-{}.log", nodes.len()));
                let pid = netns::spawn_node(&net, host, address, &args, &log);
                nodes.push(NodeProcess { host, address, pid });
            }
        }
        let file = ClusterFile {
            secret_file,
            nodes: nodes
                .iter()
                .map(|node| ClusterNode {
                    address: node.address,
                    failure_domain: format!("host-{}", node.host),
                    pid: Some(node.pid),
                    unix_socket: None,
                    metrics: None,
                })
                .collect(),
            encrypt: false,
        };
        file.save(&dir.join("cluster.json")).expect("cluster file");
        Cluster { net, dir, secret, nodes }
    }

    fn addresses(&self) -> Vec<NodeAddress> {
        self.nodes.iter().map(|node| NodeAddress { address: node.address, unix_socket: None }).collect()
    }

    fn nodes_of_host(&self, host: usize) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&node| self.nodes[node].host == host).collect()
    }

    /// Connects a client with `shape` over `pages` pages, CodingSets placement seeded by `seed`.
    /// Call it inside the client host.
    fn connect(&self, shape: Shape, pages: u64, request_timeout: Duration, seed: u64) -> Client {
        let mut config = ClientConfig::new(shape, pages * PAGE_BYTES as u64);
        config.request_timeout = request_timeout;
        let placement = Box::new(CodingSets::new(StdRng::seed_from_u64(seed), 2, GroupChoice::PowerOfTwo));
        Client::connect(&self.addresses(), &self.secret, config, placement)
            .expect("client connects from its host")
    }

    /// Panics, naming them, if node processes died that the test did not kill.
    fn check_nodes_alive(&self) {
        let exited = self.net.exited();
        assert!(exited.is_empty(), "node processes exited: {exited:?}; logs in {}", self.dir.display());
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Logs stay for a failed test to be read.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The reference model: the generation last written to each page (0: never written, zeros).
struct Model {
    generations: Vec<u64>,
}

/// What a read of many pages found.
#[derive(Debug, Default)]
struct ReadOutcome {
    correct: u64,
    /// Reads that returned an error (first few messages).
    failed: u64,
    errors: Vec<String>,
    /// Reads that returned bytes other than the model's: never allowed.
    wrong: Vec<u64>,
}

impl Model {
    fn new(pages: u64) -> Model {
        Model { generations: vec![0; pages as usize] }
    }

    /// Writes the next generation of `pages`, in batches; panics unless every write succeeds.
    fn write(&mut self, client: &mut Client, pages: &[u64]) {
        let mut buffers = vec![vec![0u8; PAGE_BYTES]; BATCH_PAGES];
        for batch in pages.chunks(BATCH_PAGES) {
            for (&page, buffer) in batch.iter().zip(buffers.iter_mut()) {
                pattern::fill(buffer, page, self.generations[page as usize] + 1, PATTERN_SEED);
            }
            let mut ops: Vec<PageOp<'_>> =
                batch.iter().zip(&buffers).map(|(&page, data)| PageOp::Write { page, data }).collect();
            let mut errors = Vec::new();
            client.execute(&mut ops, |done| {
                if let Err(error) = done.result {
                    errors.push(error.to_string());
                }
            });
            assert!(
                errors.is_empty(),
                "{} writes failed: {:?}",
                errors.len(),
                &errors[..errors.len().min(3)]
            );
            for &page in batch {
                self.generations[page as usize] += 1;
            }
        }
    }

    /// Reads `pages` in batches and compares each page read with the model.
    fn read(&self, client: &mut Client, pages: &[u64]) -> ReadOutcome {
        let mut outcome = ReadOutcome::default();
        let mut buffers = vec![vec![0u8; PAGE_BYTES]; BATCH_PAGES];
        let mut scratch = vec![0u8; PAGE_BYTES];
        for batch in pages.chunks(BATCH_PAGES) {
            let mut results = vec![true; batch.len()];
            {
                let mut ops: Vec<PageOp<'_>> = batch
                    .iter()
                    .zip(buffers.iter_mut())
                    .map(|(&page, buf)| PageOp::Read { page, buf })
                    .collect();
                client.execute(&mut ops, |done| {
                    if let Err(error) = done.result {
                        results[done.index] = false;
                        if outcome.errors.len() < 3 {
                            outcome.errors.push(error.to_string());
                        }
                    }
                });
            }
            for ((&page, buffer), ok) in batch.iter().zip(&buffers).zip(results) {
                if !ok {
                    outcome.failed += 1;
                    continue;
                }
                let generation = self.generations[page as usize];
                let right = if generation == 0 {
                    buffer.iter().all(|&byte| byte == 0)
                } else {
                    pattern::check(buffer, page, generation, PATTERN_SEED, &mut scratch)
                };
                if right {
                    outcome.correct += 1;
                } else {
                    outcome.wrong.push(page);
                }
            }
        }
        outcome
    }

    /// Reads `pages` and panics unless every page reads back as the model says.
    fn read_all_correct(&self, client: &mut Client, pages: &[u64]) {
        let outcome = self.read(client, pages);
        assert!(
            outcome.wrong.is_empty(),
            "pages read back WRONG: {:?}",
            &outcome.wrong[..outcome.wrong.len().min(10)]
        );
        assert_eq!(outcome.failed, 0, "reads failed: {:?}", outcome.errors);
        assert_eq!(outcome.correct, pages.len() as u64);
    }
}

fn all_pages(count: u64) -> Vec<u64> {
    (0..count).collect()
}

/// Latency of `count` single-page reads at queue depth 1 over random pages below `pages`, each
/// checked against the model: (p50, p99).
fn read_latency(
    client: &mut Client,
    model: &Model,
    pages: u64,
    count: usize,
    seed: u64,
) -> (Duration, Duration) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut buffer = vec![0u8; PAGE_BYTES];
    let mut scratch = vec![0u8; PAGE_BYTES];
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let page = rng.gen_range(0..pages);
        let started = Instant::now();
        client.read_page(page, &mut buffer).expect("read succeeds");
        samples.push(started.elapsed());
        let generation = model.generations[page as usize];
        assert!(
            pattern::check(&buffer, page, generation, PATTERN_SEED, &mut scratch),
            "page {page} read back wrong"
        );
    }
    samples.sort();
    (samples[count / 2], samples[count * 99 / 100])
}

/// Runs `remem bench pages` in the client host against the cluster file (every scheme, small)
/// and returns its read latencies at queue depth 1 of EC(8,2) d=1 and rep(2) as report lines.
fn bench_pages_read_latency(cluster: &Cluster) -> String {
    let cluster_file = cluster.dir.join("cluster.json").to_string_lossy().into_owned();
    let args = ["bench", "pages", "--cluster", &cluster_file, "--size", "4MiB", "--ops", "300", "--json"];
    let output = cluster.net.run(CLIENT_HOST, 90, &binary().to_string_lossy(), &args);
    assert!(output.status.success(), "remem bench pages failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("bench prints JSON");
    let mut lines =
        String::from("  remem bench pages --cluster, from the client host, delay on, 300 reads each:\n");
    for name in ["ec(8,2) d=1", "rep(2)"] {
        let series = report["series"]
            .as_array()
            .expect("series")
            .iter()
            .find(|series| {
                series["name"] == name && series["operation"] == "read" && series["queue_depth"] == 1
            })
            .unwrap_or_else(|| panic!("bench has no {name} read series at queue depth 1"));
        let latency = &series["latency"];
        lines += &format!(
            "  {name:12} read p50 {:6.0} us p99 {:6.0} us\n",
            latency["p50_us"].as_f64().expect("p50"),
            latency["p99_us"].as_f64().expect("p99")
        );
    }
    lines
}

fn micros(duration: Duration) -> u128 {
    duration.as_micros()
}

/// Drives the client's background work until `done` or `limit` passes.
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

/// The host holding the most splits of range 0 (two, with 12 nodes: at least four hosts do).
fn host_most_in_range_zero(cluster: &Cluster, client: &Client) -> usize {
    let nodes = client.range_nodes(0);
    (0..NODE_HOSTS)
        .max_by_key(|&host| {
            (cluster.nodes_of_host(host).iter().filter(|node| nodes.contains(node)).count(), host)
        })
        .expect("hosts exist")
}

#[test]
fn twelve_nodes_on_six_hosts_ec82_and_rep2_correct_with_one_host_delayed_1ms() {
    let started = Instant::now();
    let delayed_host = 0;
    let cluster = Cluster::start("delay", &[delayed_host]);
    // A command-line client from the client's host sees every node at its own address.
    let cluster_file = cluster.dir.join("cluster.json");
    let status = cluster.net.run(
        CLIENT_HOST,
        30,
        &binary().to_string_lossy(),
        &["status", "--cluster", &cluster_file.to_string_lossy()],
    );
    let status_text = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && status_text.contains("12 of 12 nodes up"),
        "remem status: {status_text} {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let report = cluster.net.run_in(CLIENT_HOST, || {
        let ec_pages = 2 * EC_RANGE_PAGES;
        let mut ec = cluster.connect(EC82, ec_pages, Duration::from_secs(2), 1);
        let mut ec_model = Model::new(ec_pages);
        ec_model.write(&mut ec, &all_pages(ec_pages));
        ec_model.read_all_correct(&mut ec, &all_pages(ec_pages));
        // 16 ranges of 256 pages: some have their first copy (the one read) on the delayed host.
        let rep_pages = 4096;
        let mut rep = cluster.connect(REP2, rep_pages, Duration::from_secs(2), 2);
        let mut rep_model = Model::new(rep_pages);
        rep_model.write(&mut rep, &all_pages(rep_pages));
        rep_model.read_all_correct(&mut rep, &all_pages(rep_pages));
        let delayed_nodes = cluster.nodes_of_host(delayed_host);
        // Split positions of the delayed host in each EC range (0-7 data, 8-9 parity).
        let delayed_splits: Vec<Vec<usize>> = (0..ec.ranges().len())
            .map(|range| {
                let nodes = ec.range_nodes(range);
                (0..nodes.len()).filter(|&split| delayed_nodes.contains(&nodes[split])).collect()
            })
            .collect();
        assert!(delayed_splits.iter().any(|splits| !splits.is_empty()), "the delayed host holds EC splits");
        let rep_ranges = rep.ranges().len();
        let rep_first_copies_delayed =
            (0..rep_ranges).filter(|&range| delayed_nodes.contains(&rep.range_nodes(range)[0])).count();

        let healthy_ec = read_latency(&mut ec, &ec_model, ec_pages, 400, 3);
        let healthy_rep = read_latency(&mut rep, &rep_model, rep_pages, 400, 4);
        let delay = Impairment { delay: Duration::from_millis(1), jitter: Duration::from_micros(200), loss_percent: 0.0 };
        cluster.net.impair(delayed_host, delay);
        ec_model.write(&mut ec, &all_pages(ec_pages));
        ec_model.read_all_correct(&mut ec, &all_pages(ec_pages));
        rep_model.write(&mut rep, &all_pages(rep_pages));
        rep_model.read_all_correct(&mut rep, &all_pages(rep_pages));
        let delayed_ec = read_latency(&mut ec, &ec_model, ec_pages, 400, 5);
        let delayed_rep = read_latency(&mut rep, &rep_model, rep_pages, 400, 6);
        let bench = bench_pages_read_latency(&cluster);
        cluster.net.impair(delayed_host, Impairment::default());
        ec_model.read_all_correct(&mut ec, &all_pages(ec_pages));
        let mut report = format!(
            "read latency at queue depth 1, 400 reads each, host {delayed_host} delayed 1 ms +- 200 us each way \
             (its splits of EC ranges 0 and 1: {delayed_splits:?}; first copies of \
             {rep_first_copies_delayed} of the {rep_ranges} rep(2) ranges; link: {})\n",
            if cluster.net.netem { "veth + netem" } else { "emulated in user space, no sch_netem" }
        );
        for (name, healthy, delayed) in [("ec(8,2) d=1", healthy_ec, delayed_ec), ("rep(2)", healthy_rep, delayed_rep)] {
            report += &format!(
                "  {name:12} healthy p50 {:6} us p99 {:6} us | delayed p50 {:6} us p99 {:6} us | p99 ratio {:.2}\n",
                micros(healthy.0),
                micros(healthy.1),
                micros(delayed.0),
                micros(delayed.1),
                delayed.1.as_secs_f64() / healthy.1.as_secs_f64()
            );
        }
        report + &bench
    });
    cluster.check_nodes_alive();
    println!("{report}  test took {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn ec82_writes_and_reads_every_byte_right_with_five_percent_loss_on_one_host() {
    let started = Instant::now();
    let lossy_host = 1;
    let cluster = Cluster::start("loss", &[lossy_host]);
    cluster.net.run_in(CLIENT_HOST, || {
        let pages = 2 * EC_RANGE_PAGES;
        let mut client = cluster.connect(EC82, pages, Duration::from_secs(2), 7);
        let mut model = Model::new(pages);
        let lossy_nodes = cluster.nodes_of_host(lossy_host);
        assert!(
            client.range_nodes(0).iter().any(|node| lossy_nodes.contains(node)),
            "the lossy host is used"
        );
        cluster.net.impair(lossy_host, Impairment { loss_percent: 5.0, ..Impairment::default() });
        for _ in 0..2 {
            model.write(&mut client, &all_pages(pages));
            model.read_all_correct(&mut client, &all_pages(pages));
        }
        cluster.net.impair(lossy_host, Impairment::default());
        model.read_all_correct(&mut client, &all_pages(pages));
    });
    cluster.check_nodes_alive();
    println!(
        "two generations of 16 MiB written and read through 5% loss in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn partitioned_host_is_rebuilt_elsewhere_and_after_healing_reads_return_the_newest_data() {
    let started = Instant::now();
    let cluster = Cluster::start("partition", &[]);
    let (to_faults, faults) = mpsc::channel::<usize>();
    let (to_client, client_events) = mpsc::channel::<()>();
    let cluster = &cluster;
    std::thread::scope(|scope| {
        // Cuts the victim host off while the client is in the middle of writing, and heals it
        // when told to.
        scope.spawn(move || {
            let Ok(victim) = faults.recv() else { return };
            std::thread::sleep(Duration::from_millis(100));
            cluster.net.partition(victim);
            let _ = to_client.send(());
            if faults.recv().is_ok() {
                cluster.net.heal(victim);
                let _ = to_client.send(());
            }
        });
        cluster.net.run_in(CLIENT_HOST, move || {
            let pages = 2 * EC_RANGE_PAGES;
            let mut client = cluster.connect(EC82, pages, Duration::from_secs(1), 11);
            let mut model = Model::new(pages);
            model.write(&mut client, &all_pages(pages));
            let victim = host_most_in_range_zero(cluster, &client);
            let victim_nodes = cluster.nodes_of_host(victim);
            to_faults.send(victim).expect("fault thread waits");
            // Generation 2 is being written when the partition comes; generation 3 entirely
            // after it.
            model.write(&mut client, &all_pages(pages));
            client_events.recv_timeout(Duration::from_secs(10)).expect("partitioned");
            model.write(&mut client, &all_pages(pages));
            let cut_off: Vec<usize> =
                victim_nodes.iter().copied().filter(|&node| !client.engine().node(node).connected).collect();
            assert_eq!(cut_off, victim_nodes, "the client lost host {victim}'s nodes to the partition");
            model.read_all_correct(&mut client, &all_pages(pages));
            assert!(client.wait_for_regenerations(Duration::from_secs(60)), "rebuilds finish within 60 s");
            let named: Vec<usize> = (0..client.ranges().len()).flat_map(|range| client.range_nodes(range)).collect();
            assert!(!named.iter().any(|node| victim_nodes.contains(node)), "slabs moved off host {victim}: {named:?}");
            let rebuilt_at = started.elapsed();

            to_faults.send(victim).expect("fault thread waits");
            client_events.recv_timeout(Duration::from_secs(10)).expect("healed");
            let readmitted = idle_until(&mut client, Duration::from_secs(20), |client| {
                victim_nodes.iter().all(|&node| client.engine().node(node).connected)
            });
            assert!(readmitted, "host {victim}'s nodes readmitted within 20 s of healing");
            // The victim's nodes still hold generation 1 or 2 of their old slabs: none of it
            // may come back.
            model.read_all_correct(&mut client, &all_pages(pages));
            model.write(&mut client, &all_pages(pages)[..EC_RANGE_PAGES as usize]);
            model.read_all_correct(&mut client, &all_pages(pages));
            println!(
                "host {victim} (nodes {victim_nodes:?}) partitioned while writing; slabs rebuilt {:.1} s into the test",
                rebuilt_at.as_secs_f64()
            );
        });
    });
    cluster.check_nodes_alive();
    println!("test took {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn killed_failure_domain_loses_no_byte_and_three_lost_domains_fail_reads_never_wrong() {
    let started = Instant::now();
    let cluster = Cluster::start("domain", &[]);
    let kill = |nodes: &[usize]| {
        for &node in nodes {
            cluster.net.signal(cluster.nodes[node].pid, libc::SIGKILL);
        }
    };
    {
        cluster.net.run_in(CLIENT_HOST, || {
            let pages = 2 * EC_RANGE_PAGES;
            let mut client = cluster.connect(EC82, pages, Duration::from_secs(1), 13);
            let mut model = Model::new(pages);
            for range in 0..client.ranges().len() {
                let domains: Vec<usize> = client.range_nodes(range).iter().map(|&node| cluster.nodes[node].host).collect();
                for host in 0..NODE_HOSTS {
                    let splits = domains.iter().filter(|&&domain| domain == host).count();
                    assert!(splits <= 2, "range {range} has {splits} splits in domain host-{host}");
                }
            }
            model.write(&mut client, &all_pages(pages));
            let lost_host = host_most_in_range_zero(&cluster, &client);
            kill(&cluster.nodes_of_host(lost_host));
            // Degraded: r splits of range 0 are gone; every byte is still there.
            model.read_all_correct(&mut client, &all_pages(pages));
            assert!(client.wait_for_regenerations(Duration::from_secs(60)), "rebuilds finish within 60 s");
            let lost_nodes = cluster.nodes_of_host(lost_host);
            let named: Vec<usize> = (0..client.ranges().len()).flat_map(|range| client.range_nodes(range)).collect();
            assert!(!named.iter().any(|node| lost_nodes.contains(node)), "slabs moved off host {lost_host}");
            model.read_all_correct(&mut client, &all_pages(pages));
            model.write(&mut client, &all_pages(pages)[..EC_RANGE_PAGES as usize]);
            model.read_all_correct(&mut client, &all_pages(pages));

            // Every range now spans the 10 nodes left; two more domains (4 splits) is beyond r.
            let more: Vec<usize> =
                (0..NODE_HOSTS).filter(|&host| host != lost_host).take(2).flat_map(|host| cluster.nodes_of_host(host)).collect();
            kill(&more);
            let reads_started = Instant::now();
            let outcome = model.read(&mut client, &all_pages(pages));
            let took = reads_started.elapsed();
            assert!(outcome.wrong.is_empty(), "beyond r, pages read back WRONG: {:?}", &outcome.wrong[..outcome.wrong.len().min(10)]);
            assert_eq!(outcome.failed, pages, "every range lost 4 of 10 splits: every read fails ({outcome:?})");
            assert!(took < Duration::from_secs(20), "failing reads are bounded: {took:?}");
            println!(
                "domain host-{lost_host} killed: all {pages} pages intact, rebuilt; then nodes {more:?} killed: \
                 {} reads failed in {:.1} s (e.g. {:?}), none wrong",
                outcome.failed,
                took.as_secs_f64(),
                outcome.errors.first()
            );
        });
    }
    println!("test took {:.1} s", started.elapsed().as_secs_f64());
}
