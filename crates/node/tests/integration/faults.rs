//! Fault injection on a real node: delays, bit flips and evictions on command.

use crate::common;

use common::*;
use remem_proto::blocking;
use remem_proto::*;
use std::time::{Duration, Instant};

const SLAB: u64 = 64 * 1024;
const SPLIT: u32 = 512;

fn inject(
    fault: FaultKind,
    slab_id: u32,
    delay_us: u32,
    fraction_ppm: u32,
    flips: u32,
    seed: u64,
) -> Control {
    Control::InjectFault { fault, slab_id, delay_us, fraction_ppm, flips, seed }
}

#[test]
fn fault_injection_is_refused_unless_enabled_and_the_connection_stays_open() {
    let node = TestNode::start(1 << 20, SLAB);
    let mut client = node.client(1);
    let reply = client.call(&inject(FaultKind::Delay, 0, 1000, 1_000_000, 0, 1));
    assert!(matches!(reply, Control::Error { code: ErrorCode::Unsupported, .. }), "{reply:?}");
    assert_eq!(client.call(&Control::Ping), Control::Pong);
}

#[test]
fn delay_holds_back_every_reply_until_cleared() {
    let node = TestNode::start_with_faults(1 << 20, SLAB);
    let mut client = node.client(1);
    let delay = Duration::from_millis(30);
    assert_eq!(
        client.call(&inject(FaultKind::Delay, 0, delay.as_micros() as u32, 1_000_000, 0, 7)),
        Control::Ok
    );
    // Every connection is affected, including ones opened before and after.
    let mut other = node.client(2);
    for connection in [&mut client, &mut other] {
        let started = Instant::now();
        assert_eq!(connection.call(&Control::Ping), Control::Pong);
        assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
    }
    assert_eq!(client.call(&inject(FaultKind::ClearFaults, 0, 0, 0, 0, 0)), Control::Ok);
    let started = Instant::now();
    for _ in 0..5 {
        assert_eq!(other.call(&Control::Ping), Control::Pong);
    }
    assert!(started.elapsed() < delay * 5, "{:?}", started.elapsed());
}

#[test]
fn delay_with_a_fraction_holds_back_about_that_share() {
    let node = TestNode::start_with_faults(1 << 20, SLAB);
    let mut client = node.client(1);
    let delay = Duration::from_millis(5);
    assert_eq!(client.call(&inject(FaultKind::Delay, 0, 5000, 250_000, 0, 3)), Control::Ok);
    let delayed = (0..80)
        .filter(|_| {
            let started = Instant::now();
            client.call(&Control::Ping);
            started.elapsed() >= delay
        })
        .count();
    assert!((5..=45).contains(&delayed), "{delayed} of 80 delayed at 25%");
}

#[test]
fn corrupt_flips_bits_of_written_slots_only_and_checksums_catch_it() {
    let node = TestNode::start_with_faults(1 << 20, SLAB);
    let mut client = node.client(1);
    let (slab_id, slots) = client.map_slab(SPLIT, 3, 100);
    let written = [2u32, 9, 40];
    let mut originals = Vec::new();
    for slot in written {
        let (payload, checksum) = checksummed_payload(SPLIT, slot as u8, 1, 100 + u64::from(slot), 3);
        client.write_split(&WriteSplitPrefix { slab_id, slot, version: 1, checksum }, &payload);
        originals.push((payload, checksum));
    }
    // Another client may not corrupt it.
    let reply = node.client(2).call(&inject(FaultKind::Corrupt, slab_id, 0, 0, 5, 1));
    assert!(matches!(reply, Control::Error { code: ErrorCode::NotOwner, .. }), "{reply:?}");

    assert_eq!(client.call(&inject(FaultKind::Corrupt, slab_id, 0, 0, 3 * 64, 11)), Control::Ok);
    let mut corrupted = 0;
    for (slot, (payload, checksum)) in written.iter().zip(&originals) {
        let (meta, read) = client.read_split(slab_id, *slot).unwrap();
        assert_eq!(meta, SplitMeta { version: 1, checksum: *checksum }, "metadata untouched");
        if read != *payload {
            corrupted += 1;
            assert_ne!(split_checksum(&read, meta.version, 100 + u64::from(*slot), 3), meta.checksum);
        }
    }
    assert_eq!(corrupted, written.len(), "192 flips over 3 slots hit each");
    for slot in (0..slots).filter(|slot| !written.contains(slot)) {
        let (meta, read) = client.read_split(slab_id, slot).unwrap();
        assert_eq!(meta, SplitMeta::default());
        assert!(read.iter().all(|byte| *byte == 0), "unwritten slot {slot} changed");
    }
}

#[test]
fn evict_tells_every_connection_of_the_owner_then_the_slab_is_unknown() {
    let node = TestNode::start_with_faults(1 << 20, SLAB);
    let mut owner = node.client(5);
    let mut second = node.client(5);
    let mut stranger = node.client(6);
    let (slab_id, _) = owner.map_slab(SPLIT, 0, 0);
    let (kept, _) = owner.map_slab(SPLIT, 1, 0);
    let reply = stranger.call(&inject(FaultKind::Evict, slab_id, 0, 0, 0, 0));
    assert!(matches!(reply, Control::Error { code: ErrorCode::NotOwner, .. }), "{reply:?}");

    // The requester hears SlabEvicted, then Ok.
    blocking::write_control(&mut owner.stream, 900, &inject(FaultKind::Evict, slab_id, 0, 0, 0, 0)).unwrap();
    let (header, notice) = blocking::read_control(&mut owner.stream, &mut owner.body).unwrap();
    assert_eq!((header.request_id, notice), (0, Control::SlabEvicted { slab_id }));
    let (header, reply) = blocking::read_control(&mut owner.stream, &mut owner.body).unwrap();
    assert_eq!((header.request_id, reply), (900, Control::Ok));

    // The owner's other connection, idle in read, gets the notice unsolicited.
    let (header, notice) = blocking::read_control(&mut second.stream, &mut second.body).unwrap();
    assert_eq!((header.request_id, notice), (0, Control::SlabEvicted { slab_id }));
    let error = second.read_split(slab_id, 0).unwrap_err();
    assert!(matches!(error, Control::Error { code: ErrorCode::UnknownSlab, .. }), "{error:?}");
    assert!(second.read_split(kept, 0).is_ok());

    // The stranger heard nothing: its next reply is the one it asks for.
    assert_eq!(stranger.call(&Control::Ping), Control::Pong);
    let Control::NodeInfoReply(info) = owner.call(&Control::NodeInfo) else { panic!("no NodeInfoReply") };
    assert_eq!(info.slabs_mapped, 1);
}

#[test]
fn node_handle_evicts_without_a_client_request() {
    let node = remem_node::Node::bind(remem_node::NodeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        capacity_bytes: 1 << 20,
        slab_size_bytes: SLAB,
        failure_domain: String::new(),
        secret: secret(),
        node_id: NODE_ID,
        max_connections: 8,
        fault_injection: false,
        resource_monitor: None,
        unix_socket: None,
        lease_grace: remem_node::leases::DEFAULT_LEASE_GRACE,
        lease_timeout: remem_node::leases::DEFAULT_LEASE_TIMEOUT,
        encrypt: false,
    })
    .unwrap();
    let handle = node.handle();
    let addr = node.local_addr();
    let shutdown = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&shutdown);
    let thread = std::thread::spawn(move || node.run(flag));
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    blocking::handshake(&mut stream, &secret(), 3).unwrap();
    let mut body = Vec::new();
    blocking::write_control(
        &mut stream,
        5,
        &Control::MapSlab { split_bytes: SPLIT, split_index: 0, first_page: 0, range_id: 1 },
    )
    .unwrap();
    let Control::SlabMapped { slab_id, .. } = blocking::read_control(&mut stream, &mut body).unwrap().1
    else {
        panic!("not mapped")
    };
    handle.evict_slab(slab_id).unwrap();
    assert_eq!(blocking::read_control(&mut stream, &mut body).unwrap().1, Control::SlabEvicted { slab_id });
    assert_eq!(handle.info().slabs_mapped, 0);
    assert!(handle.evict_slab(slab_id).is_err());
    shutdown.store(true, std::sync::atomic::Ordering::Relaxed);
    thread.join().unwrap().unwrap();
}

#[test]
fn pipelined_writes_and_reads_are_answered_in_order_from_one_buffer() {
    let node = TestNode::start(1 << 20, SLAB);
    let mut client = node.client(1);
    let (slab_id, slots) = client.map_slab(SPLIT, 0, 0);
    // Every write then every read in one burst: many frames per read() on the node.
    let mut burst = Vec::new();
    let mut expected = Vec::new();
    for slot in 0..slots {
        let (payload, checksum) = checksummed_payload(SPLIT, slot as u8, 2, u64::from(slot), 0);
        encode_write_split(
            u64::from(slot) + 1000,
            &WriteSplitPrefix { slab_id, slot, version: 2, checksum },
            &payload,
            &mut burst,
        );
        expected.push((payload, checksum));
    }
    for slot in 0..slots {
        Control::ReadSplit { slab_id, slot }.encode(u64::from(slot) + 5000, &mut burst);
    }
    Control::ReadSplits { slab_id, first_slot: 0, count: slots }.encode(9999, &mut burst);
    use std::io::Write;
    client.stream.write_all(&burst).unwrap();
    for slot in 0..slots {
        let (header, reply) = blocking::read_control(&mut client.stream, &mut client.body).unwrap();
        assert_eq!((header.request_id, reply), (u64::from(slot) + 1000, Control::WriteSplitOk));
    }
    for slot in 0..slots {
        let header = blocking::read_frame(&mut client.stream, &mut client.body).unwrap();
        assert_eq!((header.kind, header.request_id), (Kind::ReadSplitReply, u64::from(slot) + 5000));
        let (payload, checksum) = &expected[slot as usize];
        assert_eq!(
            SplitMeta::decode(client.body[..8].try_into().unwrap()).unwrap(),
            SplitMeta { version: 2, checksum: *checksum }
        );
        assert_eq!(&client.body[8..], &payload[..]);
    }
    let header = blocking::read_frame(&mut client.stream, &mut client.body).unwrap();
    assert_eq!((header.kind, header.request_id), (Kind::ReadSplitsReply, 9999));
}

#[test]
fn one_mebibyte_splits_travel_through_a_grown_buffer() {
    let slab = 2 << 20;
    let node = TestNode::start(8 << 20, slab);
    let mut client = node.client(1);
    let split = 1 << 20;
    let (slab_id, slots) = client.map_slab(split, 0, 0);
    assert_eq!(slots, 2);
    let (payload, checksum) = checksummed_payload(split, 9, 1, 1, 0);
    assert_eq!(
        client.write_split(&WriteSplitPrefix { slab_id, slot: 1, version: 1, checksum }, &payload),
        Control::WriteSplitOk
    );
    assert_eq!(client.read_split(slab_id, 1).unwrap(), (SplitMeta { version: 1, checksum }, payload));
}
