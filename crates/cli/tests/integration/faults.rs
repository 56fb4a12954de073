//! The fault-injection suite: real node processes killed (SIGKILL), stopped (SIGSTOP), slowed,
//! corrupted and evicted by command, and a writer killed mid-batch, with every page checked
//! against a model (`HashMap<page, generation>`). Seeded: a failing seed reproduces the run
//! (set REMEM_FAULT_SEED). Every test bounds its time and stops what it started.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Model, PATTERN_SEED};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use remem::faults::{inject, Fault};
use remem::launcher::LocalCluster;
use remem::pattern;
use remem_client::{Client, ClientConfig, PageOp, Shape, SlabMapFile, SlabRef};
use remem_placement::LeastLoaded;

const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };

fn seed() -> u64 {
    std::env::var("REMEM_FAULT_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or(0x5eed)
}

fn cluster(name: &str, nodes: usize) -> LocalCluster {
    common::start_cluster("faults", name, nodes, remem::launcher::UnixSockets::All)
}

fn config(pages: u64) -> ClientConfig {
    let mut config = ClientConfig::new(EC82, pages * 4096);
    config.request_timeout = Duration::from_millis(1500);
    config
}

fn connect(cluster: &LocalCluster, config: ClientConfig) -> Client {
    Client::connect(
        &cluster.addresses(),
        &cluster.secret,
        config,
        Box::new(LeastLoaded::new(StdRng::seed_from_u64(seed()))),
    )
    .expect("client connects")
}

fn all_pages(pages: u64) -> Vec<u64> {
    (0..pages).collect()
}

#[test]
fn random_kills_of_up_to_r_nodes_during_mixed_load_lose_nothing() {
    // 10 nodes hold the range, 4 spares take rebuilt slabs: four kills in two waves of two.
    let mut cluster = cluster("kills", 14);
    let pages = 2048;
    let mut client = connect(&cluster, config(pages));
    let mut rng = StdRng::seed_from_u64(seed());
    let mut model = Model::default();
    model.write(&mut client, &all_pages(pages));
    let mut killed = Vec::new();
    for wave in 0..2 {
        let mut candidates: Vec<usize> = client.ranges()[0].slabs.iter().map(|slab| slab.node).collect();
        candidates.shuffle(&mut rng);
        for round in 0..6 {
            if round == 1 || round == 3 {
                let victim = candidates.pop().unwrap();
                cluster.kill(victim).unwrap();
                killed.push(victim);
            }
            let batch: Vec<u64> = (0..384).map(|_| rng.gen_range(0..pages)).collect();
            let (writes, reads) = batch.split_at(128);
            let mut writes = writes.to_vec();
            writes.sort_unstable();
            writes.dedup();
            model.write(&mut client, &writes);
            model.read(&mut client, reads);
        }
        assert!(
            client.wait_for_regenerations(Duration::from_secs(60)),
            "wave {wave}: rebuilds did not finish"
        );
        assert_eq!(client.ranges()[0].unavailable, 0, "wave {wave}: full redundancy restored");
        model.read(&mut client, &all_pages(pages));
    }
    eprintln!(
        "seed {}: killed nodes {killed:?}, {} pages verified, {} mismatches, {} rebuilds",
        seed(),
        model.verified,
        model.mismatches,
        client.regeneration_status().done
    );
    assert_eq!(client.regeneration_status().done, 4);
}

#[test]
fn a_stopped_node_is_caught_by_the_deadline_and_reads_go_on() {
    let mut cluster = cluster("sigstop", 11);
    let pages = 2048;
    let mut client = connect(&cluster, config(pages));
    let mut model = Model::default();
    model.write(&mut client, &all_pages(pages));
    let victim = client.ranges()[0].slabs[3].node;
    cluster.signal(victim, libc::SIGSTOP).unwrap();
    model.read(&mut client, &all_pages(pages)[..512]);
    model.write(&mut client, &all_pages(pages)[..256]);
    assert!(client.ranges()[0].unavailable & (1 << 3) != 0 || client.ranges()[0].slabs[3].node != victim);
    assert!(client.wait_for_regenerations(Duration::from_secs(60)));
    model.read(&mut client, &all_pages(pages));
    cluster.signal(victim, libc::SIGCONT).unwrap();
}

#[test]
fn late_binding_reads_around_a_straggler() {
    let cluster = cluster("straggler", 10);
    let pages = 2048;
    let mut config = config(pages);
    config.request_timeout = Duration::from_secs(20);
    let mut client = connect(&cluster, config);
    let mut model = Model::default();
    model.write(&mut client, &all_pages(pages));
    // The node of data split 0 holds every reply back by 300 ms: with delta = 1 each read has
    // k other splits in flight and completes from them, decoding split 0.
    let slow = client.ranges()[0].slabs[0].node;
    let address = cluster.file.nodes[slow].address;
    inject(
        address,
        &cluster.secret,
        client.client_id(),
        Fault::Delay { delay_us: 300_000, fraction_ppm: 1_000_000, seed: 1 },
    )
    .unwrap();
    client.set_max_in_flight(1);
    let sample: Vec<u64> = (0..64).map(|page| page * 31 % pages).collect();
    let decoded = model.read(&mut client, &sample);
    inject(address, &cluster.secret, client.client_id(), Fault::Clear).unwrap();
    assert!(
        decoded >= sample.len() * 9 / 10,
        "only {decoded} of {} reads went around the straggler",
        sample.len()
    );
}

#[test]
fn every_bit_flip_is_detected_and_read_around_then_the_slab_is_rebuilt() {
    let cluster = cluster("bitflip", 11);
    let pages = 2048;
    // First pass: count detections without the thresholds getting in the way, and with no extra
    // read (delta 0), so that every read waits for split 2 and no corrupt reply arrives late.
    let mut config = ClientConfig::new(Shape { extra_reads: 0, ..EC82 }, pages * 4096);
    config.request_timeout = Duration::from_millis(1500);
    config.error_correction_limit = 2.0;
    config.slab_regeneration_limit = 2.0;
    let mut client = connect(&cluster, config);
    let mut model = Model::default();
    model.write(&mut client, &all_pages(pages));
    let victim = corrupt_split(&cluster, &client, 2, 40);
    let corrupted = count_corrupt_slots(&cluster, &client, victim.node, victim.slab_id, pages);
    assert!(corrupted > 0 && corrupted <= 40, "{corrupted} slots corrupted");
    model.read(&mut client, &all_pages(pages));
    // Split 2 is a data split that every read waits for, so every corrupted slot is seen once.
    assert_eq!(client.node_stats()[victim.node].corrupt_total, corrupted as u64, "every flip detected");
    drop(client);

    // Second pass, default thresholds: enough corruption makes the client rebuild the slab.
    let mut client = connect(&cluster, self::config(pages));
    let mut model = Model::default();
    model.write(&mut client, &all_pages(pages));
    let victim = corrupt_split(&cluster, &client, 2, 400);
    model.read(&mut client, &all_pages(pages));
    assert!(client.wait_for_regenerations(Duration::from_secs(60)));
    assert_ne!(client.ranges()[0].slabs[2].node, victim.node, "the corrupting slab was replaced");
    model.read(&mut client, &all_pages(pages));
}

/// Reads every slot of a slab over the raw protocol and counts checksum failures: the ground
/// truth of what the node corrupted.
fn count_corrupt_slots(
    cluster: &LocalCluster,
    client: &Client,
    node: usize,
    slab_id: u32,
    pages: u64,
) -> usize {
    use remem_proto::{Control, SplitMeta, SPLIT_META_BYTES};
    let address = cluster.file.nodes[node].address;
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    remem_proto::blocking::handshake(&mut stream, &cluster.secret, client.client_id()).unwrap();
    let split_index = client.ranges()[0].slabs.iter().position(|slab| slab.node == node).unwrap() as u8;
    let mut corrupt = 0;
    let mut body = Vec::new();
    for slot in 0..pages as u32 {
        remem_proto::blocking::write_control(&mut stream, 100, &Control::ReadSplit { slab_id, slot })
            .unwrap();
        remem_proto::blocking::read_frame(&mut stream, &mut body).unwrap();
        let meta = SplitMeta::decode(body[..SPLIT_META_BYTES].try_into().unwrap()).unwrap();
        let payload = &body[SPLIT_META_BYTES..];
        if remem_proto::split_checksum(payload, meta.version, slot as u64, split_index) != meta.checksum {
            corrupt += 1;
        }
    }
    corrupt
}

#[test]
fn an_evicted_slab_is_rebuilt_elsewhere_while_reads_go_on() {
    let cluster = cluster("evict", 11);
    let pages = 2048;
    let mut client = connect(&cluster, config(pages));
    let mut model = Model::default();
    model.write(&mut client, &all_pages(pages));
    let victim = client.ranges()[0].slabs[4];
    let address = cluster.file.nodes[victim.node].address;
    inject(address, &cluster.secret, client.client_id(), Fault::Evict { slab_id: victim.slab_id }).unwrap();
    // The eviction notice arrives on the client's connection; reads go on meanwhile.
    model.read(&mut client, &all_pages(pages)[..1024]);
    model.write(&mut client, &all_pages(pages)[..128]);
    assert!(client.wait_for_regenerations(Duration::from_secs(60)));
    let rebuilt = client.ranges()[0].slabs[4];
    assert_ne!(rebuilt.node, victim.node);
    assert_eq!(client.ranges()[0].unavailable, 0);
    model.read(&mut client, &all_pages(pages));
}

#[test]
fn regeneration_under_load_restores_full_redundancy() {
    let mut cluster = cluster("regen-load", 11);
    let pages = 2048;
    let mut client = connect(&cluster, config(pages));
    let mut model = Model::default();
    let mut rng = StdRng::seed_from_u64(seed());
    model.write(&mut client, &all_pages(pages));
    let first = client.ranges()[0].slabs[0].node;
    cluster.kill(first).unwrap();
    // Writes and reads during the rebuild: the rebuilt slab must end up with the pages
    // written while it was being built, not their older versions.
    let started = Instant::now();
    while client.regeneration_status().done == 0 || client.regeneration_status().in_flight > 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "rebuild never finished");
        let mut writes: Vec<u64> = (0..64).map(|_| rng.gen_range(0..pages)).collect();
        writes.sort_unstable();
        writes.dedup();
        model.write(&mut client, &writes);
        let reads: Vec<u64> = (0..64).map(|_| rng.gen_range(0..pages)).collect();
        model.read(&mut client, &reads);
        client.poll_background(Duration::from_millis(1));
    }
    // Now lose two more nodes of the range: the rebuilt slab must carry its share.
    let others: Vec<usize> = client.ranges()[0].slabs[1..3].iter().map(|slab| slab.node).collect();
    for node in others {
        cluster.kill(node).unwrap();
    }
    let decoded = model.read(&mut client, &all_pages(pages));
    assert_eq!(decoded as u64, pages, "every read decodes with splits 1 and 2 gone");
}

#[test]
fn torn_writes_from_a_killed_writer_never_read_as_a_mix() {
    let cluster = cluster("torn", 10);
    let dir = cluster.cluster_file_path.parent().unwrap().to_owned();
    let map_path = dir.join("torture-map.json");
    let pages: u64 = 2048;
    let mut writer = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(["torture-writer", "--size", &(pages * 4096).to_string(), "--cluster"])
        .arg(&cluster.cluster_file_path)
        .arg("--map")
        .arg(&map_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(writer.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Let it finish two generations, then kill it part-way through the third.
    let mut written = 0;
    while written < 2 {
        assert!(Instant::now() < deadline, "the writer is too slow");
        let line = lines.next().expect("writer output").unwrap();
        if line.starts_with("generation") {
            written += 1;
        }
    }
    std::thread::sleep(Duration::from_millis(40));
    writer.kill().unwrap();
    writer.wait().unwrap();
    // The writer may have finished more generations during the sleep: its last line says which.
    let mut last_complete = 2;
    for line in lines.map_while(Result::ok) {
        if let Some(number) = line.strip_prefix("generation ").and_then(|rest| rest.strip_suffix(" written"))
        {
            last_complete = number.parse().unwrap();
        }
    }
    let (old_generation, new_generation) = (last_complete, last_complete + 1);

    let map = SlabMapFile::load(&map_path).unwrap();
    let mut config = config(pages);
    config.release_on_drop = true;
    let mut client = Client::reopen(&map, &cluster.secret, config).unwrap();
    let mut buffers = vec![vec![0u8; 4096]; pages as usize];
    let mut results = vec![Ok(()); pages as usize];
    {
        let mut ops: Vec<PageOp<'_>> = buffers
            .iter_mut()
            .enumerate()
            .map(|(page, buf)| PageOp::Read { page: page as u64, buf })
            .collect();
        client.execute(&mut ops, |done| results[done.index] = done.result.map_err(|error| error.to_string()));
    }
    let mut scratch = vec![0u8; 4096];
    let (mut old, mut new, mut lost) = (0, 0, 0);
    for (page, (buffer, result)) in buffers.iter().zip(&results).enumerate() {
        let page = page as u64;
        match result {
            Err(error) => {
                assert!(error.contains("unreadable"), "{error}");
                lost += 1;
            }
            Ok(()) if pattern::check(buffer, page, new_generation, remem::torture::SEED, &mut scratch) => new += 1,
            Ok(()) if pattern::check(buffer, page, old_generation, remem::torture::SEED, &mut scratch) => old += 1,
            Ok(()) => panic!(
                "page {page} read back as neither generation {old_generation} nor {new_generation}: a torn write was decoded"
            ),
        }
    }
    eprintln!("after the kill: {new} pages at generation {new_generation}, {old} at {old_generation}, {lost} lost (torn)");
    assert_eq!(new + old + lost, pages);
    // How many pages are torn depends on where the kill lands; every_torn_split_count_... below
    // covers each split count exactly. What must hold here is that no page decoded as a mix.
    // A torn page is lost only until rewritten: the next write wins over every split seen.
    let mut page = vec![0u8; 4096];
    pattern::fill(&mut page, 5, 9, 1);
    client.write_page(5, &page).unwrap();
    let mut back = vec![0u8; 4096];
    client.read_page(5, &mut back).unwrap();
    assert_eq!(page, back);
}

/// What a writer that died after sending `n` of a page's ten splits leaves behind, built split
/// by split over the raw protocol so that every n from 1 to 10 is covered: a reopened client
/// must read the new contents when k = 8 new splits exist, the old ones when 8 old splits
/// remain, and report the page lost in between. Never a mix.
#[test]
fn every_torn_split_count_reads_as_old_new_or_lost() {
    use remem_codec::{new_codec, CodecParams};
    use remem_proto::{Control, SplitMeta, WriteSplitPrefix, SPLIT_META_BYTES};

    let cluster = cluster("torn-exact", 10);
    let pages = 2048;
    let mut config = config(pages);
    config.release_on_drop = false;
    let mut client = connect(&cluster, config);
    let mut model = Model::default();
    model.write(&mut client, &all_pages(pages));
    let map = client.slab_map();
    drop(client);

    // One raw connection per node, as the dead writer's client id.
    let mut streams: Vec<std::net::TcpStream> = map
        .nodes
        .iter()
        .map(|address| {
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            remem_proto::blocking::handshake(&mut stream, &cluster.secret, map.client_id).unwrap();
            stream
        })
        .collect();
    let mut codec = new_codec(CodecParams::new(8, 2, 4096).unwrap());
    let mut body = Vec::new();
    for page in 0..=10u64 {
        let torn_splits = page as usize; // page n gets n new splits (0 = untouched)
        let (node, slab_id) = map.ranges[0][0];
        remem_proto::blocking::write_control(
            &mut streams[node],
            1,
            &Control::ReadSplit { slab_id, slot: page as u32 },
        )
        .unwrap();
        remem_proto::blocking::read_frame(&mut streams[node], &mut body).unwrap();
        let old_version = SplitMeta::decode(body[..SPLIT_META_BYTES].try_into().unwrap()).unwrap().version;
        let version = remem_proto::next_version(old_version);
        let mut data = vec![0u8; 4096];
        pattern::fill(&mut data, page, 99, PATTERN_SEED);
        let mut parity = vec![0u8; 1024];
        codec.encode(&data, &mut parity);
        for split in 0..torn_splits {
            let payload =
                if split < 8 { &data[split * 512..][..512] } else { &parity[(split - 8) * 512..][..512] };
            let (node, slab_id) = map.ranges[0][split];
            let prefix = WriteSplitPrefix {
                slab_id,
                slot: page as u32,
                version,
                checksum: remem_proto::split_checksum(payload, version, page, split as u8),
            };
            let mut frame = Vec::new();
            remem_proto::encode_write_split(9, &prefix, payload, &mut frame);
            std::io::Write::write_all(&mut streams[node], &frame).unwrap();
            remem_proto::blocking::read_frame(&mut streams[node], &mut body).unwrap();
        }
    }

    let mut client = Client::reopen(&map, &cluster.secret, self::config(pages)).unwrap();
    let mut scratch = vec![0u8; 4096];
    for page in 0..=10u64 {
        let mut buffer = vec![0u8; 4096];
        let result = client.read_page(page, &mut buffer);
        let new_splits = page;
        if new_splits >= 8 {
            result.unwrap();
            assert!(
                pattern::check(&buffer, page, 99, PATTERN_SEED, &mut scratch),
                "page {page}: new contents"
            );
        } else if new_splits <= 2 {
            result.unwrap();
            assert!(
                pattern::check(&buffer, page, 1, PATTERN_SEED, &mut scratch),
                "page {page}: old contents"
            );
        } else {
            let error = result.expect_err("neither version has k splits");
            assert!(error.to_string().contains("unreadable"), "page {page}: {error}");
        }
    }
    // The rest of the pages were never torn.
    let rest: Vec<u64> = (11..pages).collect();
    let mut model_rest =
        Model { generations: rest.iter().map(|&page| (page, 1)).collect(), ..Model::default() };
    model_rest.read(&mut client, &rest);
}

/// Flips `flips` random bits in the slab of `split` in range 0 and returns that slab.
fn corrupt_split(cluster: &LocalCluster, client: &Client, split: usize, flips: u32) -> SlabRef {
    let victim = client.ranges()[0].slabs[split];
    let address = cluster.file.nodes[victim.node].address;
    let fault = Fault::Corrupt { slab_id: victim.slab_id, flips, seed: seed() };
    inject(address, &cluster.secret, client.client_id(), fault).unwrap();
    victim
}

/// With CodingSets (13 nodes, EC(8,2), l=2: one extended group of 12 and one spare), a slab
/// lost from a range is rebuilt on one of the two group members the range does not use: the
/// range stays inside its group, so failures do not add copysets, and the spare stays empty.
#[test]
fn a_rebuilt_slab_stays_in_the_extended_group_of_its_range() {
    use remem_placement::{CodingSets, GroupChoice, NodeLoad};
    let cluster = cluster("codingsets", 13);
    let pages = 2048;
    let policy = CodingSets::new(StdRng::seed_from_u64(seed()), 2, GroupChoice::PowerOfTwo);
    let mut client =
        Client::connect(&cluster.addresses(), &cluster.secret, config(pages), Box::new(policy)).unwrap();
    assert_eq!(client.ranges().len(), 1);
    // The same membership rule on the same candidates gives the same groups (it uses no RNG).
    let candidates: Vec<NodeLoad> = client
        .node_infos()
        .into_iter()
        .enumerate()
        .map(|(node_index, (_, info))| NodeLoad {
            node_index,
            failure_domain: info.unwrap().failure_domain,
            slabs_mapped: 0,
            slabs_free: 16,
        })
        .collect();
    let mut mirror = CodingSets::new(StdRng::seed_from_u64(0), 2, GroupChoice::PowerOfTwo);
    mirror.update_membership(&candidates, 10).unwrap();
    let (_, group) = mirror.groups().next().unwrap();
    assert_eq!((group.len(), mirror.spares().len()), (12, 1));
    let in_range: Vec<usize> = client.ranges()[0].slabs.iter().map(|slab| slab.node).collect();
    assert!(in_range.iter().all(|node| group.contains(node)), "the range is in the group");
    let unused: Vec<usize> = group.iter().copied().filter(|node| !in_range.contains(node)).collect();

    let mut model = Model::default();
    model.write(&mut client, &all_pages(pages));
    let victim = client.ranges()[0].slabs[4];
    let address = cluster.file.nodes[victim.node].address;
    inject(address, &cluster.secret, client.client_id(), Fault::Evict { slab_id: victim.slab_id }).unwrap();
    model.read(&mut client, &all_pages(pages)[..256]);
    assert!(client.wait_for_regenerations(Duration::from_secs(60)));
    let rebuilt = client.ranges()[0].slabs[4].node;
    assert!(unused.contains(&rebuilt), "rebuilt on node {rebuilt}, not one of the group's unused {unused:?}");
    model.read(&mut client, &all_pages(pages));
}

/// A client restarted from its saved slab map while one node of its range is down: it opens,
/// reads every page (discovering versions from the other splits), writes, and rebuilds the
/// missing slab elsewhere.
#[test]
fn a_client_reopens_its_saved_map_with_a_node_down() {
    let mut cluster = cluster("reopen-down", 11);
    let dir = cluster.cluster_file_path.parent().unwrap().to_owned();
    let map_path = dir.join("reopen-map.json");
    let pages = 2048;
    let (mut model, ranges) = written_and_saved(&cluster, &map_path, pages);
    let victim = ranges[0].slabs[3].node;
    cluster.kill(victim).unwrap();
    let mut client = reopened(&cluster, &map_path, pages);
    assert!(client.ranges()[0].unavailable & (1 << 3) != 0 || client.ranges()[0].slabs[3].node != victim);
    model.read(&mut client, &all_pages(pages));
    model.write(&mut client, &all_pages(pages)[..256]);
    assert!(client.wait_for_regenerations(Duration::from_secs(60)));
    assert_ne!(client.ranges()[0].slabs[3].node, victim, "the lost slab was rebuilt elsewhere");
    assert_eq!(client.ranges()[0].unavailable, 0);
    model.read(&mut client, &all_pages(pages));
}

/// A page discarded by a reopened client (which does not know its version yet) reads as zeros,
/// as it does in the client that wrote it: before the fix the read went to the nodes and
/// returned the bytes written before the discard.
#[test]
fn a_page_discarded_after_a_reopen_reads_as_zeros_not_its_old_bytes() {
    let cluster = cluster("reopen-discard", 10);
    let map_path = cluster.cluster_file_path.parent().unwrap().join("discard-map.json");
    let pages = 64;
    let (mut model, _) = written_and_saved(&cluster, &map_path, pages);
    let mut client = reopened(&cluster, &map_path, pages);
    for page in 0..4 {
        client.discard_page(page).unwrap();
    }
    let mut buffers = vec![vec![0xaa_u8; 4096]; 4];
    let mut ops: Vec<PageOp<'_>> =
        buffers.iter_mut().enumerate().map(|(page, buf)| PageOp::Read { page: page as u64, buf }).collect();
    client.execute_all(&mut ops).unwrap();
    drop(ops);
    for (page, buf) in buffers.iter().enumerate() {
        assert!(buf.iter().all(|&byte| byte == 0), "discarded page {page} read back bytes");
    }
    model.read(&mut client, &all_pages(pages)[4..]);
}

/// A client that wrote `pages` pages (what `Model` expects of them), saved its map to `map_path`
/// and stopped, leaving its slabs: the model and the ranges it had.
fn written_and_saved(
    cluster: &LocalCluster,
    map_path: &std::path::Path,
    pages: u64,
) -> (Model, Vec<remem_client::Range>) {
    let mut config = config(pages);
    config.release_on_drop = false;
    let mut client = connect(cluster, config);
    let mut model = Model::default();
    model.write(&mut client, &all_pages(pages));
    client.save_map(map_path).unwrap();
    (model, client.ranges().to_vec())
}

/// The client of `map_path` reopened (its slabs given back when dropped).
fn reopened(cluster: &LocalCluster, map_path: &std::path::Path, pages: u64) -> Client {
    let map = SlabMapFile::load(map_path).unwrap();
    let mut config = config(pages);
    config.release_on_drop = true;
    Client::reopen(&map, &cluster.secret, config).expect("reopens")
}
