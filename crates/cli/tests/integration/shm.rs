//! The shared-memory transport with real `remem node` processes on Unix sockets: EC(8,2) pages
//! written and verified through shared memory, ranges that mix shared-memory and TCP nodes, a
//! node SIGKILLed while its slabs are mapped, an evicted (revoked) slab, and the ownership and
//! transport checks of `ExportSlab`. Every test bounds its time; clusters stop their own PIDs.

use crate::common;

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{Model, SLAB_BYTES};
use rand::rngs::StdRng;
use rand::SeedableRng;
use remem::faults::{inject, Fault};
use remem::launcher::{LocalCluster, UnixSockets};
use remem_client::{Client, ClientConfig, Shape};
use remem_placement::LeastLoaded;
use remem_proto::{Control, ErrorCode};

const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
const PAGES: u64 = 2048;

fn cluster(name: &str, nodes: usize, unix_sockets: UnixSockets) -> LocalCluster {
    common::start_cluster("shm", name, nodes, unix_sockets)
}

fn connect(cluster: &LocalCluster) -> Client {
    let mut config = ClientConfig::new(EC82, PAGES * 4096);
    config.request_timeout = Duration::from_millis(1500);
    config.shared_memory = true;
    Client::connect(
        &cluster.addresses(),
        &cluster.secret,
        config,
        Box::new(LeastLoaded::new(StdRng::seed_from_u64(7))),
    )
    .expect("client connects")
}

fn all_pages() -> Vec<u64> {
    (0..PAGES).collect()
}

fn requests_served(client: &mut Client) -> u64 {
    client.node_infos().into_iter().map(|(_, info)| info.expect("node answers").requests_served).sum()
}

#[test]
fn ec82_pages_written_and_verified_through_shared_memory_without_node_requests() {
    let cluster = cluster("ec82", 10, UnixSockets::All);
    let mut client = connect(&cluster);
    assert_eq!(client.shared_memory_splits(0), EC82.all_splits(), "every slab is exported");
    let mut model = Model::default();
    let before = requests_served(&mut client);
    model.write(&mut client, &all_pages());
    model.read(&mut client, &all_pages());
    model.write(&mut client, &all_pages()[..512]);
    model.read(&mut client, &all_pages());
    // Ops on shared memory complete inside the call that starts them; their latency is still
    // wall time, not the engine's clock (which did not move).
    let mut page = vec![0u8; 4096];
    let mut latencies = Vec::new();
    client.execute(&mut [remem_client::PageOp::Read { page: 7, buf: &mut page }], |done| {
        latencies.push(done.latency)
    });
    assert!(
        latencies.len() == 1 && !latencies[0].is_zero(),
        "latency of a shared-memory read: {latencies:?}"
    );
    // 2048 + 512 page writes of 10 splits and 4096 page reads: none reached a node's CPU; only
    // the NodeInfo requests (one per node per call) did.
    let served = requests_served(&mut client) - before;
    assert!(served <= 2 * 10, "nodes served {served} requests");
}

#[test]
fn a_range_mixing_shared_memory_and_tcp_nodes_reads_and_writes_every_page() {
    let cluster = cluster("mixed", 10, UnixSockets::Only(vec![0, 2, 4, 6, 8]));
    let mut client = connect(&cluster);
    let shm = client.shared_memory_splits(0);
    let range = &client.ranges()[0];
    for (split, slab) in range.slabs.iter().enumerate() {
        assert_eq!(shm & (1 << split) != 0, slab.node % 2 == 0, "split {split} on node {}", slab.node);
    }
    assert_eq!(shm.count_ones(), 5);
    let mut model = Model::default();
    model.write(&mut client, &all_pages());
    model.read(&mut client, &all_pages());
    model.write(&mut client, &all_pages()[1000..1500]);
    model.read(&mut client, &all_pages());
}

#[test]
fn a_killed_node_is_never_used_again_and_reads_never_return_wrong_data() {
    let mut cluster = cluster("kill", 11, UnixSockets::All);
    let mut client = connect(&cluster);
    let mut model = Model::default();
    model.write(&mut client, &all_pages());
    let victim_split = 3;
    let victim = client.ranges()[0].slabs[victim_split];
    assert!(client.shared_memory_splits(0) & (1 << victim_split) != 0);
    cluster.kill(victim.node).expect("SIGKILL");
    // Reads go on while and after the client notices (the Unix socket's EOF).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        model.read(&mut client, &all_pages()[..256]);
        let range = &client.ranges()[0];
        let still_mapped =
            client.shared_memory_splits(0) & (1 << victim_split) != 0 && range.slabs[victim_split] == victim;
        if !still_mapped {
            break;
        }
        assert!(Instant::now() < deadline, "the client never noticed the dead node");
        std::thread::sleep(Duration::from_millis(2));
    }
    model.read(&mut client, &all_pages());
    model.write(&mut client, &all_pages()[..256]);
    model.read(&mut client, &all_pages());
    assert!(client.wait_for_regenerations(Duration::from_secs(60)), "rebuild finishes");
    let rebuilt = client.ranges()[0].slabs[victim_split];
    assert_ne!(rebuilt.node, victim.node, "the dead node's slab is not used again");
    assert_eq!(client.ranges()[0].unavailable, 0);
    model.read(&mut client, &all_pages());
}

#[test]
fn an_evicted_shared_slab_is_revoked_punched_out_and_rebuilt() {
    let cluster = cluster("evict", 11, UnixSockets::All);
    let mut client = connect(&cluster);
    let mut model = Model::default();
    model.write(&mut client, &all_pages());
    let victim = client.ranges()[0].slabs[0];
    let address = cluster.file.nodes[victim.node].address;
    inject(address, &cluster.secret, client.client_id(), Fault::Evict { slab_id: victim.slab_id }).unwrap();
    // The next write to the slab sees the revoked flag at once (no socket involved): the page is
    // written degraded to the other nine, and reads read around the slab.
    model.write(&mut client, &all_pages()[..64]);
    assert_eq!(client.shared_memory_splits(0) & 1, 0, "a revoked slab is unmapped");
    model.read(&mut client, &all_pages());
    assert!(client.wait_for_regenerations(Duration::from_secs(60)));
    assert_ne!(client.ranges()[0].slabs[0], victim);
    model.read(&mut client, &all_pages());
    // The rebuilt slab was exported between batches: the whole range is shared memory again.
    assert_eq!(client.shared_memory_splits(0), EC82.all_splits(), "the rebuilt slab is mapped");
    model.write(&mut client, &all_pages()[..64]);
    model.read(&mut client, &all_pages());
}

#[test]
fn bits_flipped_in_a_shared_data_slab_are_caught_and_read_around() {
    let cluster = cluster("corrupt", 10, UnixSockets::All);
    let mut client = connect(&cluster);
    let mut model = Model::default();
    model.write(&mut client, &all_pages());
    // The node flips bits in its own memory: the client's mapping sees them at once, on the
    // path where every data split is shared (reads skip per-split bookkeeping there).
    let victim = client.ranges()[0].slabs[3];
    let address = cluster.file.nodes[victim.node].address;
    inject(
        address,
        &cluster.secret,
        client.client_id(),
        Fault::Corrupt { slab_id: victim.slab_id, flips: 200, seed: 9 },
    )
    .unwrap();
    // Every page reads back as written: a flipped split fails its checksum and is decoded around.
    let decoded = model.read(&mut client, &all_pages());
    assert!(decoded > 0, "pages with a flipped split were decoded from the others");
    let corrupt: u64 = client.node_stats().iter().map(|stats| stats.corrupt_total).sum();
    assert!(corrupt > 0, "the flipped splits were counted as corrupt");
}

#[test]
fn only_the_owner_may_export_a_slab_and_only_over_a_unix_socket() {
    let cluster = cluster("owner", 1, UnixSockets::All);
    let path = cluster.file.nodes[0].unix_socket.clone().expect("node has a socket");
    let connect_as = |client_id: u64| {
        let mut stream = UnixStream::connect(&path).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        remem_proto::blocking::handshake(&mut stream, &cluster.secret, client_id).expect("handshake");
        stream
    };
    let call = |stream: &mut UnixStream, request_id: u64, message: &Control| {
        remem_proto::blocking::write_control(stream, request_id, message).expect("send");
        let mut body = Vec::new();
        remem_proto::blocking::read_control(stream, &mut body).expect("reply").1
    };
    let mut owner = connect_as(1);
    let map = Control::MapSlab { split_bytes: 512, split_index: 0, first_page: 0, range_id: 0 };
    let Control::SlabMapped { slab_id, .. } = call(&mut owner, 2, &map) else { panic!("slab not mapped") };
    let mut other = connect_as(2);
    match call(&mut other, 3, &Control::ExportSlab { slab_id }) {
        Control::Error { code: ErrorCode::NotOwner, .. } => {}
        reply => panic!("another client id got {reply:?}"),
    }
    match call(&mut other, 4, &Control::ExportSlab { slab_id: slab_id + 100 }) {
        Control::Error { code: ErrorCode::UnknownSlab, .. } => {}
        reply => panic!("an unknown slab got {reply:?}"),
    }
    // Over TCP the node has no way to pass a descriptor.
    let mut tcp = std::net::TcpStream::connect(cluster.file.nodes[0].address).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    remem_proto::blocking::handshake(&mut tcp, &cluster.secret, 1).unwrap();
    remem_proto::blocking::write_control(&mut tcp, 5, &Control::ExportSlab { slab_id }).unwrap();
    let mut body = Vec::new();
    match remem_proto::blocking::read_control(&mut tcp, &mut body).unwrap().1 {
        Control::Error { code: ErrorCode::Unsupported, .. } => {}
        reply => panic!("ExportSlab over TCP got {reply:?}"),
    }
    // The owner gets it (the descriptor itself is dropped by this plain read).
    match call(&mut owner, 6, &Control::ExportSlab { slab_id }) {
        Control::SlabExported { slab_id: exported, epoch, layout } => {
            assert_eq!(exported, slab_id);
            assert!(epoch >= 1);
            assert_eq!(layout.slab_bytes, SLAB_BYTES);
        }
        reply => panic!("the owner got {reply:?}"),
    }
}

/// A client restarted from its saved slab map maps its slabs as shared memory again (the map
/// records each node's Unix socket) and reads every page back, its versions discovered anew.
#[test]
fn a_reopened_client_maps_its_slabs_as_shared_memory_again() {
    let cluster = cluster("reopen", 10, UnixSockets::All);
    let map_path = cluster.cluster_file_path.parent().unwrap().join("shm-map.json");
    let mut client = {
        let mut config = ClientConfig::new(EC82, PAGES * 4096);
        config.shared_memory = true;
        config.release_on_drop = false;
        Client::connect(
            &cluster.addresses(),
            &cluster.secret,
            config,
            Box::new(LeastLoaded::new(StdRng::seed_from_u64(7))),
        )
        .unwrap()
    };
    let mut model = Model::default();
    model.write(&mut client, &all_pages());
    client.save_map(&map_path).unwrap();
    drop(client);

    let map = remem_client::SlabMapFile::load(&map_path).unwrap();
    assert!(map.unix_sockets.iter().all(Option::is_some), "{:?}", map.unix_sockets);
    let mut config = ClientConfig::new(EC82, PAGES * 4096);
    config.shared_memory = true;
    config.release_on_drop = true;
    let mut client = Client::reopen(&map, &cluster.secret, config).unwrap();
    assert_eq!(client.shared_memory_splits(0), EC82.all_splits(), "every slab is exported again");
    model.read(&mut client, &all_pages());
    model.write(&mut client, &all_pages()[..128]);
    model.read(&mut client, &all_pages());
}

/// Many client threads at once, each its own client (clients are driven by one thread) on the
/// same ten nodes' shared memory: no lock is shared on the data path, and every page of every
/// client reads back exactly.
#[test]
fn client_threads_write_and_read_shared_memory_at_once() {
    let cluster = cluster("threads", 10, UnixSockets::All);
    let threads: Vec<_> = (0..4u64)
        .map(|thread| {
            let addresses = cluster.addresses();
            let secret = cluster.secret.clone();
            std::thread::spawn(move || {
                let mut config = ClientConfig::new(EC82, PAGES * 4096);
                config.shared_memory = true;
                let policy = Box::new(LeastLoaded::new(StdRng::seed_from_u64(thread)));
                let mut client = Client::connect(&addresses, &secret, config, policy).unwrap();
                assert_eq!(client.shared_memory_splits(0), EC82.all_splits());
                let mut model = Model::default();
                for round in 0..3 {
                    model.write(&mut client, &all_pages());
                    model.read(&mut client, &all_pages());
                    model.write(&mut client, &all_pages()[(round * 100) as usize..][..100]);
                }
                model.read(&mut client, &all_pages());
                model.verified
            })
        })
        .collect();
    for thread in threads {
        let verified = thread.join().expect("a client thread failed");
        assert_eq!(verified, 4 * PAGES);
    }
}
