//! A real node on 127.0.0.1 driven over TCP with `remem_proto::blocking`.

use crate::common;

use common::*;
use remem_proto::auth::{self, Secret};
use remem_proto::blocking::{self, HandshakeError};
use remem_proto::*;
use std::io::Write;
use std::net::Shutdown;

const SLAB: u64 = 64 * 1024;
const SPLIT: u32 = 512;

/// The slab's memfd: split bytes, 5 bytes of metadata per slot, the shared-memory header and
/// the rounding to a page (`remem_proto::shm::ShmLayout`).
fn slab_footprint(split_bytes: u32) -> u64 {
    let layout = remem_proto::shm::ShmLayout::new(SLAB, split_bytes).unwrap();
    assert!(layout.total_bytes >= SLAB + SLAB / u64::from(split_bytes) * remem_node::METADATA_BYTES_PER_SLOT);
    layout.total_bytes
}

#[test]
fn handshake_with_wrong_secret_is_rejected_on_both_sides() {
    let node = TestNode::start(1 << 20, SLAB);
    let wrong = Secret::from_bytes(b"not-the-cluster-secret".to_vec()).unwrap();

    // The client notices the node does not prove our secret.
    let mut stream = node.connect_raw();
    let result = blocking::handshake(&mut stream, &wrong, 1);
    assert!(matches!(result, Err(HandshakeError::NodeProofMismatch)), "{result:?}");

    // The node refuses a client that does not prove the secret.
    let mut stream = node.connect_raw();
    let client_nonce = [3u8; 32];
    blocking::write_control(&mut stream, 1, &Control::Hello { client_id: 1, client_nonce, session: 0 })
        .unwrap();
    let mut body = Vec::new();
    let Control::Challenge { node_nonce, .. } = blocking::read_control(&mut stream, &mut body).unwrap().1
    else {
        panic!("no Challenge");
    };
    let client_proof = auth::client_proof(&wrong, &client_nonce, &node_nonce, 1);
    blocking::write_control(&mut stream, 2, &Control::Auth { client_proof }).unwrap();
    expect_error_and_close(&mut stream, ErrorCode::AuthFailed);

    // And still serves the right secret.
    let mut client = node.client(1);
    assert_eq!(client.call(&Control::Ping), Control::Pong);
}

#[test]
fn requests_before_auth_get_not_authenticated() {
    let node = TestNode::start(1 << 20, SLAB);
    let mut stream = node.connect_raw();
    blocking::write_control(&mut stream, 5, &Control::NodeInfo).unwrap();
    expect_error_and_close(&mut stream, ErrorCode::NotAuthenticated);

    // Hello, then something other than Auth.
    let mut stream = node.connect_raw();
    blocking::write_control(
        &mut stream,
        1,
        &Control::Hello { client_id: 1, client_nonce: [0; 32], session: 0 },
    )
    .unwrap();
    let mut body = Vec::new();
    blocking::read_control(&mut stream, &mut body).unwrap();
    blocking::write_control(&mut stream, 2, &Control::Ping).unwrap();
    expect_error_and_close(&mut stream, ErrorCode::NotAuthenticated);
}

#[test]
fn map_write_read_round_trip_with_checksum() {
    let capacity = 1 << 20;
    let node = TestNode::start(capacity, SLAB);
    let mut client = node.client(9);
    let (first_page, split_index) = (1000, 2);
    let (slab_id, slots) = client.map_slab(SPLIT, split_index, first_page);
    assert_eq!(u64::from(slots), SLAB / u64::from(SPLIT));

    let (payload, checksum) = checksummed_payload(SPLIT, 7, 1, first_page + 3, split_index);
    let reply = client.write_split(&WriteSplitPrefix { slab_id, slot: 3, version: 1, checksum }, &payload);
    assert_eq!(reply, Control::WriteSplitOk);
    let (meta, read) = client.read_split(slab_id, 3).unwrap();
    assert_eq!(meta, SplitMeta { version: 1, checksum });
    assert_eq!(read, payload);
    assert_eq!(split_checksum(&read, meta.version, first_page + 3, split_index), meta.checksum);

    // Overwrite with a newer version.
    let (payload2, checksum2) = checksummed_payload(SPLIT, 99, 2, first_page + 3, split_index);
    client.write_split(&WriteSplitPrefix { slab_id, slot: 3, version: 2, checksum: checksum2 }, &payload2);
    assert_eq!(
        client.read_split(slab_id, 3).unwrap(),
        (SplitMeta { version: 2, checksum: checksum2 }, payload2.clone())
    );

    // A slot never written reads as version 0, checksum 0, zero bytes.
    let (meta, read) = client.read_split(slab_id, 4).unwrap();
    assert_eq!(meta, SplitMeta::default());
    assert!(read.iter().all(|byte| *byte == 0));

    // ReadSplits over slots 2..=5.
    let request_id = client.request_id();
    blocking::write_control(
        &mut client.stream,
        request_id,
        &Control::ReadSplits { slab_id, first_slot: 2, count: 4 },
    )
    .unwrap();
    let header = blocking::read_frame(&mut client.stream, &mut client.body).unwrap();
    assert_eq!((header.kind, header.request_id), (Kind::ReadSplitsReply, request_id));
    assert_eq!(Some(header.body_len), read_splits_reply_body_len(4, SPLIT));
    assert_eq!(decode_read_splits_count(client.body[..4].try_into().unwrap()).unwrap(), 4);
    let entries: Vec<_> = client.body[4..].chunks_exact(SPLIT_META_BYTES + SPLIT as usize).collect();
    assert_eq!(entries.len(), 4);
    let meta_of = |entry: &[u8]| SplitMeta::decode(entry[..SPLIT_META_BYTES].try_into().unwrap()).unwrap();
    assert_eq!(meta_of(entries[0]), SplitMeta::default());
    assert_eq!(meta_of(entries[1]), SplitMeta { version: 2, checksum: checksum2 });
    assert_eq!(&entries[1][SPLIT_META_BYTES..], &payload2[..]);

    // NodeInfo accounts for the slab and its metadata.
    let Control::NodeInfoReply(info) = client.call(&Control::NodeInfo) else {
        panic!("no NodeInfoReply");
    };
    assert_eq!(info.node_id, NODE_ID);
    assert_eq!(info.capacity_bytes, capacity);
    assert_eq!(info.slab_size_bytes, SLAB);
    assert_eq!(info.slabs_mapped, 1);
    assert_eq!(info.metadata_bytes, slab_footprint(SPLIT) - SLAB);
    assert!(info.metadata_bytes <= u64::from(slots) * 5 + 4096);
    assert_eq!(info.free_bytes, capacity - slab_footprint(SPLIT));
    assert_eq!(info.failure_domain, "rack-1");
    assert!(info.requests_served >= 7, "{}", info.requests_served);
    assert_eq!(client.call(&Control::Ping), Control::Pong);
}

#[test]
fn another_client_id_gets_not_owner_and_the_owner_keeps_its_slab_across_reconnects() {
    let node = TestNode::start(1 << 20, SLAB);
    let mut owner = node.client(1);
    let (slab_id, _) = owner.map_slab(SPLIT, 0, 0);
    let (payload, checksum) = checksummed_payload(SPLIT, 1, 1, 5, 0);
    owner.write_split(&WriteSplitPrefix { slab_id, slot: 5, version: 1, checksum }, &payload);

    let mut other = node.client(2);
    let error = other.read_split(slab_id, 5).unwrap_err();
    assert!(matches!(error, Control::Error { code: ErrorCode::NotOwner, .. }), "{error:?}");
    let reply = other.call(&Control::UnmapSlab { slab_id });
    assert!(matches!(reply, Control::Error { code: ErrorCode::NotOwner, .. }), "{reply:?}");
    // Refusals without a payload keep the connection open.
    assert_eq!(other.call(&Control::Ping), Control::Pong);
    // A refused WriteSplit closes it, without the payload touching the slab.
    other.send_write_split(
        &WriteSplitPrefix { slab_id, slot: 5, version: 2, checksum: 0 },
        &[0xAA; SPLIT as usize],
    );
    other.expect_error_and_close(ErrorCode::NotOwner);

    drop(owner);
    let mut owner_again = node.client(1);
    assert_eq!(owner_again.read_split(slab_id, 5).unwrap(), (SplitMeta { version: 1, checksum }, payload));
}

#[test]
fn out_of_range_slots_are_refused() {
    let node = TestNode::start(1 << 20, SLAB);
    let mut client = node.client(1);
    let (slab_id, slots) = client.map_slab(SPLIT, 0, 0);
    let error = client.read_split(slab_id, slots).unwrap_err();
    assert!(matches!(error, Control::Error { code: ErrorCode::SlotOutOfRange, .. }), "{error:?}");
    let reply = client.call(&Control::ReadSplits { slab_id, first_slot: slots - 2, count: 3 });
    assert!(matches!(reply, Control::Error { code: ErrorCode::SlotOutOfRange, .. }), "{reply:?}");
    let reply = client.call(&Control::ReadSplits { slab_id, first_slot: u32::MAX, count: 256 });
    assert!(matches!(reply, Control::Error { code: ErrorCode::SlotOutOfRange, .. }), "{reply:?}");
    assert_eq!(client.call(&Control::Ping), Control::Pong);
    client.send_write_split(
        &WriteSplitPrefix { slab_id, slot: slots, version: 1, checksum: 0 },
        &[0; SPLIT as usize],
    );
    client.expect_error_and_close(ErrorCode::SlotOutOfRange);
}

#[test]
fn read_splits_larger_than_one_frame_is_refused() {
    let node = TestNode::start(4 << 20, 1 << 20);
    let mut client = node.client(1);
    let (slab_id, _) = client.map_slab(4096, 0, 0);
    let allowed = max_read_splits_count(4096);
    assert!(allowed < 256);
    let reply = client.call(&Control::ReadSplits { slab_id, first_slot: 0, count: allowed + 1 });
    assert!(matches!(reply, Control::Error { code: ErrorCode::SlotOutOfRange, .. }), "{reply:?}");
    let request_id = client.request_id();
    blocking::write_control(
        &mut client.stream,
        request_id,
        &Control::ReadSplits { slab_id, first_slot: 0, count: allowed },
    )
    .unwrap();
    let header = blocking::read_frame(&mut client.stream, &mut client.body).unwrap();
    assert_eq!(header.kind, Kind::ReadSplitsReply);
    assert!(client.body[4..]
        .chunks_exact(SPLIT_META_BYTES + 4096)
        .all(|entry| entry.iter().all(|b| *b == 0)));
}

#[test]
fn capacity_exhausted_then_freed_by_unmap() {
    let node = TestNode::start(2 * slab_footprint(SPLIT), SLAB);
    let mut client = node.client(1);
    let (first, _) = client.map_slab(SPLIT, 0, 0);
    client.map_slab(SPLIT, 1, 0);
    let reply =
        client.call(&Control::MapSlab { split_bytes: SPLIT, split_index: 2, first_page: 0, range_id: 1 });
    assert!(matches!(reply, Control::Error { code: ErrorCode::NoCapacity, .. }), "{reply:?}");
    assert_eq!(client.call(&Control::UnmapSlab { slab_id: first }), Control::Ok);
    let (third, _) = client.map_slab(SPLIT, 2, 0);
    assert_ne!(third, first, "slab ids are not reused while the node has unused ones");
    let Control::NodeInfoReply(info) = client.call(&Control::NodeInfo) else { panic!() };
    assert_eq!((info.slabs_mapped, info.free_bytes), (2, 0));
}

#[test]
fn bad_split_sizes_are_refused() {
    let node = TestNode::start(1 << 20, SLAB);
    let mut client = node.client(1);
    for split_bytes in [0, 32, 100, 513, SLAB as u32 * 2] {
        let reply =
            client.call(&Control::MapSlab { split_bytes, split_index: 0, first_page: 0, range_id: 1 });
        assert!(
            matches!(reply, Control::Error { code: ErrorCode::BadSplitSize, .. }),
            "{split_bytes}: {reply:?}"
        );
    }
    let (slab_id, slots) = client.map_slab(SLAB as u32, 0, 0);
    assert_eq!(slots, 1);
    // A payload that is not the slab's split size closes the connection.
    client.send_write_split(&WriteSplitPrefix { slab_id, slot: 0, version: 1, checksum: 0 }, &[1; 100]);
    client.expect_error_and_close(ErrorCode::BadSplitSize);
}

#[test]
fn unmapped_slab_is_unknown() {
    let node = TestNode::start(1 << 20, SLAB);
    let mut client = node.client(1);
    let (slab_id, _) = client.map_slab(SPLIT, 0, 0);
    assert_eq!(client.call(&Control::UnmapSlab { slab_id }), Control::Ok);
    let error = client.read_split(slab_id, 0).unwrap_err();
    assert!(matches!(error, Control::Error { code: ErrorCode::UnknownSlab, .. }), "{error:?}");
    let reply = client.call(&Control::UnmapSlab { slab_id });
    assert!(matches!(reply, Control::Error { code: ErrorCode::UnknownSlab, .. }), "{reply:?}");
    client.send_write_split(
        &WriteSplitPrefix { slab_id, slot: 0, version: 1, checksum: 0 },
        &[0; SPLIT as usize],
    );
    client.expect_error_and_close(ErrorCode::UnknownSlab);
}

#[test]
fn malformed_frames_get_an_error_and_a_closed_connection_while_others_are_served() {
    detect_connection_panics();
    let node = TestNode::start(1 << 20, SLAB);
    let mut bystander = node.client(50);
    let valid_ping = || {
        let mut frame = Vec::new();
        Control::Ping.encode(1, &mut frame);
        frame
    };

    let mut bad_magic = valid_ping();
    bad_magic[0] = b'X';
    let mut bad_version = valid_ping();
    bad_version[2] = 9;
    let mut unknown_kind = valid_ping();
    unknown_kind[3] = 200;
    let mut huge_body = valid_ping();
    huge_body[3] = Kind::WriteSplit as u8;
    huge_body[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut wrong_length = valid_ping();
    wrong_length[4] = 3;
    wrong_length.extend_from_slice(&[0; 3]);
    let mut bad_body = Vec::new();
    Control::ReadSplits { slab_id: 1, first_slot: 0, count: 1 }.encode(1, &mut bad_body);
    bad_body[HEADER_BYTES + 8..].copy_from_slice(&0u32.to_le_bytes());

    for (name, frame) in [
        ("bad magic", bad_magic),
        ("bad version", bad_version),
        ("unknown kind", unknown_kind),
        ("huge body_len", huge_body),
        ("wrong length for kind", wrong_length),
        ("ReadSplits count 0", bad_body),
    ] {
        for authenticated in [false, true] {
            let mut client = node.client(1);
            if !authenticated {
                client.stream = node.connect_raw();
            }
            client.stream.write_all(&frame).unwrap();
            let mut body = Vec::new();
            match blocking::read_control(&mut client.stream, &mut body) {
                Ok((_, Control::Error { code, .. })) => {
                    // A well-formed header of a kind other than Hello is refused before auth
                    // without reading its body.
                    let expected = if !authenticated && name == "ReadSplits count 0" {
                        ErrorCode::NotAuthenticated
                    } else {
                        ErrorCode::Malformed
                    };
                    assert_eq!(code, expected, "{name}, authenticated: {authenticated}");
                }
                other => panic!("{name}: expected Error(Malformed), got {other:?}"),
            }
            expect_closed(&mut client.stream);
            assert_eq!(bystander.call(&Control::Ping), Control::Pong, "{name}");
        }
    }

    // A reply kind sent as a request.
    let mut client = node.client(1);
    blocking::write_control(&mut client.stream, 1, &Control::SlabMapped { slab_id: 1, slots: 1 }).unwrap();
    client.expect_error_and_close(ErrorCode::Unsupported);

    // Truncated frames: half a header, and a header whose body never fully arrives.
    for cut in [7, HEADER_BYTES + 10] {
        let mut client = node.client(1);
        let mut frame = Vec::new();
        Control::MapSlab { split_bytes: SPLIT, split_index: 0, first_page: 0, range_id: 0 }
            .encode(1, &mut frame);
        client.stream.write_all(&frame[..cut]).unwrap();
        client.stream.shutdown(Shutdown::Write).unwrap();
        expect_closed(&mut client.stream);
    }
    assert_eq!(bystander.call(&Control::Ping), Control::Pong);
    node.stop();
    assert_no_connection_panicked();
}

#[test]
fn connections_over_the_limit_are_refused() {
    let node = TestNode::start_with(1 << 20, SLAB, 2);
    let mut first = node.client(1);
    let _second = node.client(2);
    // A third connection may authenticate (connections still authenticating have a pool of
    // their own), but it is refused at the end of its handshake and closed.
    let mut third = node.connect_raw();
    match blocking::handshake(&mut third, &secret(), 3) {
        Err(blocking::HandshakeError::Rejected { code: ErrorCode::NoCapacity, .. }) => {}
        other => panic!("expected NoCapacity at the end of the handshake, got {other:?}"),
    }
    expect_closed(&mut third);
    drop(_second);
    // The slot frees once the node notices the close; retry briefly.
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    loop {
        let mut stream = node.connect_raw();
        if blocking::handshake(&mut stream, &secret(), 3).is_ok() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "connection slot never freed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(first.call(&Control::Ping), Control::Pong);
}

#[test]
fn two_connections_of_one_client_share_a_slab() {
    let node = TestNode::start(1 << 20, SLAB);
    let mut setup = node.client(4);
    let (slab_id, slots) = setup.map_slab(SPLIT, 1, 4000);
    let threads: Vec<_> = (0..2u32)
        .map(|half| {
            let mut client = node.client(4);
            std::thread::spawn(move || {
                for round in 0..20u8 {
                    for slot in (half..slots).step_by(2) {
                        let version = next_version(round);
                        let (payload, checksum) = checksummed_payload(
                            SPLIT,
                            round ^ slot as u8,
                            version,
                            4000 + u64::from(slot),
                            1,
                        );
                        assert_eq!(
                            client.write_split(
                                &WriteSplitPrefix { slab_id, slot, version, checksum },
                                &payload
                            ),
                            Control::WriteSplitOk
                        );
                        let (meta, read) = client.read_split(slab_id, slot).unwrap();
                        assert_eq!(meta, SplitMeta { version, checksum });
                        assert_eq!(read, payload);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn stopping_the_node_closes_connections() {
    let node = TestNode::start(1 << 20, SLAB);
    let mut client = node.client(1);
    client.map_slab(SPLIT, 0, 0);
    let started = std::time::Instant::now();
    node.stop();
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    expect_closed(&mut client.stream);
}

#[test]
fn bind_rejects_invalid_configs() {
    let config =
        |slab_size_bytes: u64, failure_domain: &str, max_connections: usize| remem_node::NodeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            capacity_bytes: 1 << 20,
            slab_size_bytes,
            failure_domain: failure_domain.to_owned(),
            secret: secret(),
            node_id: 1,
            max_connections,
            fault_injection: false,
            resource_monitor: None,
            unix_socket: None,
            lease_grace: remem_node::leases::DEFAULT_LEASE_GRACE,
            lease_timeout: remem_node::leases::DEFAULT_LEASE_TIMEOUT,
            encrypt: false,
        };
    for bad in [
        config(1000, "a", 1),
        config(2048, "a", 1),
        config(1 << 33, "a", 1),
        config(SLAB, &"x".repeat(65), 1),
        config(SLAB, "a", 0),
    ] {
        let error = remem_node::Node::bind(bad).err().expect("bind accepted an invalid config");
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    }
}
