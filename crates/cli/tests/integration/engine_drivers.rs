//! The engine's drivers and run-time membership, with real node processes: the poll driver
//! embedded in a test's own mio loop (many ops in flight, new ones arriving, a straggler that
//! holds back only the ops that need it), and nodes added and drained while a client runs.

use crate::common;

use std::time::Duration;

use mio::{Events, Poll, Token};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem::faults::{inject, Fault};
use remem::launcher::{LocalCluster, UnixSockets};
use remem::pattern;
use remem_client::engine::OpBuffers;
use remem_client::{Client, ClientConfig, PollClient, Shape, Submit};
use remem_placement::LeastLoaded;

use common::{Model, PATTERN_SEED};

const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };

fn cluster(name: &str, nodes: usize) -> LocalCluster {
    common::start_cluster("drivers", name, nodes, UnixSockets::None)
}

fn connect(cluster: &LocalCluster, nodes: usize, config: ClientConfig) -> Client {
    Client::connect(
        &cluster.addresses()[..nodes],
        &cluster.secret,
        config,
        Box::new(LeastLoaded::new(StdRng::seed_from_u64(7))),
    )
    .expect("client connects")
}

/// Runs an idle client's background work until it has declared `count` nodes failed.
fn wait_until_failed(client: &mut Client, count: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client.engine().nodes().iter().filter(|node| !node.connected).count() < count {
        assert!(std::time::Instant::now() < deadline, "the client did not notice {count} failed nodes");
        client.poll_background(Duration::from_millis(50));
    }
}

/// The test's own op table: one page buffer per tag.
struct Pages {
    buffers: Vec<Vec<u8>>,
}

impl OpBuffers for Pages {
    fn read_buffer(&mut self, tag: usize) -> &mut [u8] {
        &mut self.buffers[tag]
    }
}

#[derive(Clone, Copy)]
enum InFlight {
    Read { page: u64 },
    Write { page: u64, generation: u64 },
}

#[test]
fn poll_driver_keeps_64_ops_in_flight_and_a_straggler_holds_back_only_its_own() {
    let cluster = cluster("poll", 12);
    let pages = 2 * 2048; // two ranges of 1 MiB slabs at EC(8,2)
    let mut config = ClientConfig::new(EC82, pages * 4096);
    config.max_in_flight = 80;
    config.request_timeout = Duration::from_secs(20);
    let mut client = connect(&cluster, 12, config);
    let mut model = Model::default();
    model.write(&mut client, &(0..pages).collect::<Vec<_>>());

    // A node of range 0 that range 1 does not use holds every reply back by 2 s.
    let range0 = client.range_nodes(0);
    let range1 = client.range_nodes(1);
    let slow = *range0.iter().find(|node| !range1.contains(node)).expect("least-loaded placement spreads");
    let address = cluster.file.nodes[slow].address;
    let delay = Fault::Delay { delay_us: 2_000_000, fraction_ppm: 1_000_000, seed: 3 };
    inject(address, &cluster.secret, client.client_id(), delay).expect("delay injected");

    let mut poll_client = PollClient::new(client);
    let mut poll = Poll::new().expect("poll");
    poll_client.register(poll.registry(), Token(7)).expect("register");
    let mut events = Events::with_capacity(64);
    let slots = 65;
    let mut buffers = Pages { buffers: vec![vec![0; 4096]; slots] };
    let mut in_flight: Vec<Option<InFlight>> = vec![None; slots];
    let mut generations = model.generations.clone();
    let mut rng = StdRng::seed_from_u64(11);
    let mut write_data = vec![0u8; 4096];

    // Tag 64: one write to range 0, which needs the straggler's ack.
    let slow_page = 5;
    let slow_generation = generations[&slow_page] + 1;
    pattern::fill(&mut write_data, slow_page, slow_generation, PATTERN_SEED);
    assert!(poll_client.submit(64, Submit::Write { page: slow_page, data: &write_data }, &mut buffers));
    in_flight[64] = Some(InFlight::Write { page: slow_page, generation: slow_generation });

    let mut completed_while_slow = 0usize;
    let mut slow_done = false;
    let mut most_in_flight = 0;
    let mut verified = 0;
    let mut scratch = vec![0u8; 4096];
    let started = std::time::Instant::now();
    while !slow_done {
        assert!(started.elapsed() < Duration::from_secs(60), "the loop did not finish");
        // New requests keep arriving: fill every free tag with an op on range 1 (pages
        // 2048..4096), never two on one page.
        for tag in 0..64 {
            if in_flight[tag].is_some() {
                continue;
            }
            let page = loop {
                let page = rng.gen_range(2048..pages);
                if !in_flight.iter().flatten().any(|op| match op {
                    InFlight::Read { page: busy } | InFlight::Write { page: busy, .. } => *busy == page,
                }) {
                    break page;
                }
            };
            let op = if rng.gen_bool(0.5) {
                let generation = generations[&page] + 1;
                pattern::fill(&mut write_data, page, generation, PATTERN_SEED);
                assert!(poll_client.submit(tag, Submit::Write { page, data: &write_data }, &mut buffers));
                InFlight::Write { page, generation }
            } else {
                assert!(poll_client.submit(tag, Submit::Read { page }, &mut buffers));
                InFlight::Read { page }
            };
            in_flight[tag] = Some(op);
        }
        most_in_flight = most_in_flight.max(poll_client.in_flight());
        let timeout = poll_client
            .next_deadline()
            .map(|deadline| deadline.saturating_duration_since(std::time::Instant::now()));
        poll.poll(&mut events, timeout.map(|timeout| timeout.min(Duration::from_millis(50)))).expect("poll");
        if events.iter().any(|event| event.token() == Token(7)) {
            poll_client.on_readable(&mut buffers);
        } else {
            poll_client.on_timer(&mut buffers);
        }
        let done: Vec<_> = poll_client.completions().collect();
        for done in done {
            let op = in_flight[done.index].take().expect("a completion for an op in flight");
            done.result.as_ref().expect("no op fails: the straggler is only slow");
            match op {
                InFlight::Write { page, generation } => {
                    generations.insert(page, generation);
                }
                InFlight::Read { page } => {
                    let generation = generations[&page];
                    assert!(
                        pattern::check(
                            &buffers.buffers[done.index],
                            page,
                            generation,
                            PATTERN_SEED,
                            &mut scratch
                        ),
                        "page {page} read back wrong"
                    );
                    verified += 1;
                }
            }
            if done.index == 64 {
                slow_done = true;
            } else {
                completed_while_slow += 1;
            }
        }
    }
    eprintln!(
        "{completed_while_slow} ops on range 1 completed while a write waited on the straggler; \
         {verified} reads verified; at most {most_in_flight} in flight"
    );
    assert!(most_in_flight >= 64, "only {most_in_flight} ops were in flight at once");
    assert!(
        completed_while_slow >= 500,
        "the straggler held back ops that do not need it: {completed_while_slow} completed meanwhile"
    );
    assert!(verified > 0);
}

#[test]
fn a_node_added_at_run_time_takes_rebuilt_slabs() {
    // The client starts on 11 of 12 nodes (width 10, one spare); two kills leave 9, too few for
    // a range, until the twelfth node joins.
    let mut cluster = cluster("add", 12);
    let pages = 2048;
    let mut config = ClientConfig::new(EC82, pages * 4096);
    config.request_timeout = Duration::from_millis(1500);
    let mut client = connect(&cluster, 11, config);
    let mut model = Model::default();
    let all: Vec<u64> = (0..pages).collect();
    model.write(&mut client, &all);
    let nodes = client.range_nodes(0);
    cluster.kill(nodes[0]).unwrap();
    cluster.kill(nodes[1]).unwrap();
    // An idle client notices (the connections close; heartbeats would catch a hang) and
    // rebuilds what it can: one slab on the spare, the other has nowhere to go.
    wait_until_failed(&mut client, 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client.regeneration_status().done < 1 {
        assert!(std::time::Instant::now() < deadline, "the spare did not take a slab");
        client.poll_background(Duration::from_millis(50));
    }
    model.read(&mut client, &all);
    assert_ne!(client.ranges()[0].unavailable, 0, "nine nodes cannot hold a range of ten");
    let added = client.add_node(&cluster.addresses()[11]).expect("node added");
    assert!(client.wait_for_regenerations(Duration::from_secs(60)), "rebuilds finish once the node joins");
    assert_eq!(client.ranges()[0].unavailable, 0, "full redundancy again");
    assert!(client.slabs_on(added) >= 1, "the added node took a rebuilt slab");
    model.read(&mut client, &all);
}

#[test]
fn a_drained_node_ends_with_no_slabs_and_every_page_verifies() {
    let cluster = cluster("drain", 12);
    let pages = 2048;
    let config = ClientConfig::new(EC82, pages * 4096);
    let mut client = connect(&cluster, 12, config);
    let mut model = Model::default();
    let all: Vec<u64> = (0..pages).collect();
    model.write(&mut client, &all);
    let drained = client.range_nodes(0)[3];
    client.drain_node(drained);
    // Reads and writes go on during the drain.
    model.write(&mut client, &all[..256]);
    model.read(&mut client, &all[..512]);
    assert!(client.wait_for_regenerations(Duration::from_secs(60)), "the drain finishes");
    assert_eq!(client.slabs_on(drained), 0, "no range names the drained node");
    assert_eq!(client.ranges()[0].unavailable, 0);
    // Its slab was released on the node itself.
    client.poll_background(Duration::from_millis(200));
    let infos = client.node_infos();
    let info = infos[drained].1.as_ref().expect("the drained node still answers");
    assert_eq!(info.slabs_mapped, 0, "the drained node still maps {} slabs", info.slabs_mapped);
    model.read(&mut client, &all);
}

#[test]
fn one_client_holds_regions_of_different_shapes_and_survives_their_failures() {
    // EC(8,2) (the first region), rep(3) (k=1, r=2) and no redundancy (r=0) in one page space.
    let mut cluster = cluster("regions", 12);
    let ec_pages = 2048;
    let mut config = ClientConfig::new(EC82, ec_pages * 4096);
    config.request_timeout = Duration::from_millis(1500);
    let mut client = connect(&cluster, 12, config);
    let replicated = client
        .create_region(Shape { data_splits: 1, parity_splits: 2, extra_reads: 0 }, 256 * 4096)
        .expect("rep(3) region");
    let plain = client
        .create_region(Shape { data_splits: 1, parity_splits: 0, extra_reads: 0 }, 64 * 4096)
        .expect("region without redundancy");
    assert_eq!(replicated.first_page, ec_pages);
    assert_eq!(plain.first_page, ec_pages + 256);
    assert_eq!(client.page_count(), ec_pages + 256 + 64);
    assert_eq!(client.regions().len(), 3);
    // A replicated range is on 3 slabs of 4 KiB splits, a plain one on 1.
    let rep_range = client.ranges().iter().position(|range| range.region == replicated.index).unwrap();
    assert_eq!(client.ranges()[rep_range].slabs.len(), 3);
    let plain_range = client.ranges().iter().position(|range| range.region == plain.index).unwrap();
    assert_eq!(client.ranges()[plain_range].slabs.len(), 1);

    let mut model = Model::default();
    let all: Vec<u64> = (0..client.page_count()).collect();
    model.write(&mut client, &all);
    model.read(&mut client, &all);
    let mut buffer = vec![0; 4096];
    assert!(client.read_page(client.page_count(), &mut buffer).is_err(), "past the last region");

    // Two nodes of the replicated range die (r = 2 for both coded regions); the plain region's
    // node is spared, since it has no redundancy to lose.
    let plain_node = client.ranges()[plain_range].slabs[0].node;
    let victims: Vec<usize> = client.ranges()[rep_range]
        .slabs
        .iter()
        .map(|slab| slab.node)
        .filter(|node| *node != plain_node)
        .take(2)
        .collect();
    for &victim in &victims {
        cluster.kill(victim).unwrap();
    }
    wait_until_failed(&mut client, 2);
    model.read(&mut client, &all);
    model.write(&mut client, &all[..300]);
    assert!(client.wait_for_regenerations(Duration::from_secs(60)), "rebuilds of every shape finish");
    for range in client.ranges() {
        assert_eq!(range.unavailable, 0, "range of region {} fully redundant again", range.region);
    }
    model.read(&mut client, &all);
}

/// Lazy ranges (`ClientConfig::lazy_ranges`, what `remem kv` grows with): a region has its pages
/// but no slabs; an op there is refused, not sent; a range is mapped while reads are in flight on
/// the poll driver (they complete with their bytes); a range laid beside another goes on the
/// node the rule names, and a range of the other mapped later avoids it; a released range's
/// slabs leave the nodes and its pages start over as never written.
#[test]
fn lazy_ranges_map_while_reads_are_in_flight_and_keep_the_beside_rule() {
    let cluster = cluster("lazy", 12);
    let mut config = ClientConfig::new(EC82, 0);
    config.lazy_ranges = true;
    let mut client = connect(&cluster, 12, config);
    assert!(client.regions().is_empty(), "no region without an address space");
    // 1 MiB slabs of 512-byte splits: 2048 pages a range, three ranges.
    let ec = client.create_region(EC82, 3 * 2048 * 4096).expect("EC region");
    let per_range = ec.pages_per_range;
    assert_eq!(per_range, 2048);
    let none = Shape { data_splits: 1, parity_splits: 0, extra_reads: 0 };
    let beside = client.create_region_beside(none, ec.page_count * 4096, &ec, 8).expect("beside");
    assert_eq!(client.mapped_range_count(), 0, "nothing mapped yet");
    let first_ec_range = client.ranges().iter().position(|range| range.region == ec.index).unwrap();
    let first_beside = client.ranges().iter().position(|range| range.region == beside.index).unwrap();
    let page = vec![7u8; 4096];
    let refused = client.write_page(ec.first_page, &page).expect_err("unmapped");
    assert!(matches!(refused, remem_client::PageError::Unmapped { .. }), "{refused}");
    // A beside range before the range it lies beside: refused.
    assert!(client.map_range(first_beside, &mut remem_client::engine::NoBuffers).is_err());

    client.map_range(first_ec_range, &mut remem_client::engine::NoBuffers).expect("map EC range 0");
    client.map_range(first_beside, &mut remem_client::engine::NoBuffers).expect("map beside range 0");
    let parity_node = client.ranges()[first_ec_range].slabs[8].node;
    assert_eq!(
        client.ranges()[first_beside].slabs[0].node,
        parity_node,
        "main copy on the first parity's node"
    );
    let mut model = Model::default();
    let pages: Vec<u64> = (ec.first_page..ec.first_page + 64).collect();
    model.write(&mut client, &pages);

    // Reads in flight on range 0 while range 1 is mapped: they complete, byte-exact.
    struct Pages(Vec<Vec<u8>>);
    impl OpBuffers for Pages {
        fn read_buffer(&mut self, tag: usize) -> &mut [u8] {
            &mut self.0[tag]
        }
    }
    let mut poll = PollClient::new(client);
    let mut buffers = Pages(vec![vec![0; 4096]; 16]);
    for (tag, &page) in pages[..16].iter().enumerate() {
        assert!(poll.submit(tag, Submit::Read { page }, &mut buffers), "read {page} starts");
    }
    poll.client().map_range(first_ec_range + 1, &mut buffers).expect("map EC range 1 with reads in flight");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut done = 0;
    while done < 16 {
        assert!(std::time::Instant::now() < deadline, "reads complete");
        poll.on_timer(&mut buffers);
        for op in poll.completions() {
            op.result.expect("read");
            done += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let client = poll.client();
    let mut scratch = vec![0; 4096];
    for (tag, &page) in pages[..16].iter().enumerate() {
        let generation = model.generations[&page];
        assert!(pattern::check(&buffers.0[tag], page, generation, PATTERN_SEED, &mut scratch), "page {page}");
    }
    // EC ranges 0 and 1, and the beside range of the main copies of range 0's pages.
    assert_eq!(client.mapped_range_count(), 3);

    // Released: the slabs leave the nodes, and a range mapped again starts empty.
    let slabs_on_nodes = |client: &mut Client| -> u32 {
        let infos = client.node_infos();
        infos.iter().filter_map(|(_, info)| info.as_ref().ok()).map(|info| info.slabs_mapped).sum()
    };
    let slabs_before = slabs_on_nodes(client);
    assert!(client.release_range(first_ec_range + 1), "nothing in flight on range 1");
    client.poll_background(Duration::from_millis(200));
    assert_eq!(slabs_before - slabs_on_nodes(client), 10, "the range's ten slabs are unmapped");
    let second = ec.first_page + per_range;
    let refused = client.read_page(second, &mut vec![0; 4096]).expect_err("unmapped again");
    assert!(matches!(refused, remem_client::PageError::Unmapped { .. }), "{refused}");
    model.read(client, &pages);
}
