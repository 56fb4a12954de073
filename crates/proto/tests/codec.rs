//! Round-trip and robustness properties of the remem-proto codec.

use proptest::prelude::*;
use remem_proto::auth::{self, Secret};
use remem_proto::shm::ShmLayout;
use remem_proto::*;

fn error_code() -> impl Strategy<Value = ErrorCode> {
    proptest::sample::select(ErrorCode::ALL.to_vec())
}

/// A source with an IPv4 address or an IPv6 one that is not IPv4-mapped (the mapped form decodes
/// as IPv4), and no flow info or scope id (not carried on the wire).
fn regeneration_source() -> impl Strategy<Value = RegenerationSource> {
    let address = prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| std::net::SocketAddr::from((ip, port))),
        (any::<[u16; 8]>(), any::<u16>())
            .prop_filter("not IPv4-mapped", |(ip, _)| std::net::Ipv6Addr::from(*ip)
                .to_ipv4_mapped()
                .is_none())
            .prop_map(|(ip, port)| std::net::SocketAddr::from((std::net::Ipv6Addr::from(ip), port))),
    ];
    (any::<u8>(), any::<u32>(), address).prop_map(|(split_index, slab_id, address)| RegenerationSource {
        split_index,
        slab_id,
        address,
    })
}

fn control() -> impl Strategy<Value = Control> {
    prop_oneof![
        (any::<u64>(), any::<[u8; 32]>(), any::<u64>()).prop_map(|(client_id, client_nonce, session)| {
            Control::Hello { client_id, client_nonce, session }
        }),
        (any::<[u8; 32]>(), any::<[u8; 32]>())
            .prop_map(|(node_nonce, node_proof)| { Control::Challenge { node_nonce, node_proof } }),
        any::<[u8; 32]>().prop_map(|client_proof| Control::Auth { client_proof }),
        any::<u64>().prop_map(|node_id| Control::AuthOk { node_id }),
        (any::<u32>(), any::<u8>(), any::<u64>(), any::<u64>()).prop_map(
            |(split_bytes, split_index, first_page, range_id)| Control::MapSlab {
                split_bytes,
                split_index,
                first_page,
                range_id
            }
        ),
        (any::<u32>(), any::<u32>()).prop_map(|(slab_id, slots)| Control::SlabMapped { slab_id, slots }),
        any::<u32>().prop_map(|slab_id| Control::UnmapSlab { slab_id }),
        Just(Control::Ok),
        Just(Control::NodeInfo),
        (
            any::<[u64; 8]>(),
            any::<[u32; 5]>(),
            proptest::string::string_regex("[a-zé0-9/-]{0,64}").expect("valid regex")
        )
            .prop_filter("failure domain fits", |(_, _, domain)| domain.len() <= MAX_FAILURE_DOMAIN_BYTES)
            .prop_map(|(n, m, failure_domain)| {
                Control::NodeInfoReply(NodeInfo {
                    node_id: n[0],
                    capacity_bytes: n[1],
                    free_bytes: n[2],
                    slab_size_bytes: n[3],
                    slabs_mapped: m[0],
                    metadata_bytes: n[4],
                    requests_served: n[5],
                    regenerating_slabs: m[1],
                    regeneration_pages_done: n[6],
                    regeneration_pages_total: n[7],
                    clients_live: m[2],
                    clients_in_grace: m[3],
                    slabs_in_grace: m[4],
                    failure_domain,
                })
            }),
        (
            proptest::sample::select(FaultKind::ALL.to_vec()),
            any::<[u32; 3]>(),
            0..=MAX_FRACTION_PPM,
            any::<u64>()
        )
            .prop_map(|(fault, n, fraction_ppm, seed)| Control::InjectFault {
                fault,
                slab_id: n[0],
                delay_us: n[1],
                fraction_ppm,
                flips: n[2],
                seed
            }),
        any::<u32>().prop_map(|slab_id| Control::SlabEvicted { slab_id }),
        (
            any::<u32>(),
            any::<[u8; 2]>(),
            any::<[u32; 2]>(),
            proptest::collection::vec(regeneration_source(), 1..=MAX_REGENERATION_SOURCES)
        )
            .prop_map(|(slab_id, splits, n, sources)| Control::Regenerate {
                slab_id,
                data_splits: splits[0],
                parity_splits: splits[1],
                page_bytes: n[0],
                pages: n[1],
                sources
            }),
        (any::<u32>(), any::<[u64; 3]>()).prop_map(|(slab_id, n)| Control::RegenerationDone {
            slab_id,
            pages_rebuilt: n[0],
            pages_skipped: n[1],
            pages_lost: n[2]
        }),
        any::<u32>().prop_map(|slab_id| Control::ExportSlab { slab_id }),
        Just(Control::AnswerActivity),
        any::<u32>().prop_map(|slab_id| Control::SlabActivityQuery { slab_id }),
        (any::<u32>(), any::<u64>())
            .prop_map(|(slab_id, accesses)| Control::SlabActivity { slab_id, accesses }),
        (any::<u32>(), 1..=u64::MAX, 12u32..=32, 6u32..=20)
            .prop_filter("split fits in the slab", |(_, _, slab_log, split_log)| split_log <= slab_log)
            .prop_map(|(slab_id, epoch, slab_log, split_log)| Control::SlabExported {
                slab_id,
                epoch,
                layout: ShmLayout::new(1 << slab_log, 1 << split_log).expect("valid sizes"),
            }),
        Just(Control::Ping),
        Just(Control::Pong),
        (error_code(), proptest::string::string_regex(".{0,64}").expect("valid regex"))
            .prop_map(|(code, message)| Control::Error { code, message }),
        Just(Control::WriteSplitOk),
        (any::<u32>(), any::<u32>()).prop_map(|(slab_id, slot)| Control::ReadSplit { slab_id, slot }),
        (any::<u32>(), any::<u32>(), 1..=READ_SPLITS_MAX_COUNT)
            .prop_map(|(slab_id, first_slot, count)| Control::ReadSplits { slab_id, first_slot, count }),
    ]
}

proptest! {
    #[test]
    fn every_control_message_round_trips(msg in control(), request_id in any::<u64>()) {
        let mut frame = Vec::new();
        msg.encode(request_id, &mut frame);
        let header_bytes: &[u8; HEADER_BYTES] = frame[..HEADER_BYTES].try_into().unwrap();
        let header = FrameHeader::decode(header_bytes).unwrap();
        prop_assert_eq!(header.kind, msg.kind());
        prop_assert_eq!(header.request_id, request_id);
        prop_assert_eq!(header.body_len as usize, frame.len() - HEADER_BYTES);
        let decoded = Control::decode_body(header.kind, &frame[HEADER_BYTES..]).unwrap();
        prop_assert_eq!(&decoded, &msg);
        prop_assert_eq!(fuzzing::decode_stream(&frame), 1);
    }

    #[test]
    fn write_split_frame_round_trips(
        slab_id in any::<u32>(), slot in any::<u32>(), version in 1u8..=255, checksum in any::<u32>(),
        payload in proptest::collection::vec(any::<u8>(), 0..600), request_id in any::<u64>(),
    ) {
        let prefix = WriteSplitPrefix { slab_id, slot, version, checksum };
        let mut frame = Vec::new();
        encode_write_split(request_id, &prefix, &payload, &mut frame);
        let header = FrameHeader::decode(frame[..HEADER_BYTES].try_into().unwrap()).unwrap();
        prop_assert_eq!(header.kind, Kind::WriteSplit);
        prop_assert_eq!(header.request_id, request_id);
        prop_assert_eq!(header.body_len as usize, WRITE_SPLIT_PREFIX_BYTES + payload.len());
        let body = &frame[HEADER_BYTES..];
        prop_assert_eq!(WriteSplitPrefix::decode(body[..WRITE_SPLIT_PREFIX_BYTES].try_into().unwrap()).unwrap(), prefix);
        prop_assert_eq!(&body[WRITE_SPLIT_PREFIX_BYTES..], &payload[..]);
    }

    #[test]
    fn read_split_reply_round_trips(
        version in any::<u8>(), checksum in any::<u32>(),
        payload in proptest::collection::vec(any::<u8>(), 0..600), request_id in any::<u64>(),
    ) {
        let meta = SplitMeta { version, checksum };
        let mut frame = Vec::new();
        encode_read_split_reply(request_id, meta, &payload, &mut frame);
        let header = FrameHeader::decode(frame[..HEADER_BYTES].try_into().unwrap()).unwrap();
        prop_assert_eq!(header.kind, Kind::ReadSplitReply);
        prop_assert_eq!(header.body_len as usize, SPLIT_META_BYTES + payload.len());
        let body = &frame[HEADER_BYTES..];
        prop_assert_eq!(SplitMeta::decode(body[..SPLIT_META_BYTES].try_into().unwrap()).unwrap(), meta);
        prop_assert_eq!(&body[SPLIT_META_BYTES..], &payload[..]);
        prop_assert_eq!(fuzzing::decode_stream(&frame), 1);
    }

    #[test]
    fn read_splits_reply_round_trips(
        split_bytes in proptest::sample::select(vec![64u32, 512, 4096]),
        entries in proptest::collection::vec((any::<u8>(), any::<u32>(), any::<u8>()), 1..=8),
        request_id in any::<u64>(),
    ) {
        let count = entries.len() as u32;
        let mut frame = Vec::new();
        encode_read_splits_reply_head(request_id, count, split_bytes, &mut frame);
        for (version, checksum, fill) in &entries {
            frame.extend_from_slice(&SplitMeta { version: *version, checksum: *checksum }.encode());
            frame.extend(std::iter::repeat_n(*fill, split_bytes as usize));
        }
        let header = FrameHeader::decode(frame[..HEADER_BYTES].try_into().unwrap()).unwrap();
        prop_assert_eq!(header.kind, Kind::ReadSplitsReply);
        prop_assert_eq!(header.body_len as usize, frame.len() - HEADER_BYTES);
        let body = &frame[HEADER_BYTES..];
        prop_assert_eq!(decode_read_splits_count(body[..4].try_into().unwrap()).unwrap(), count);
        let entry_bytes = SPLIT_META_BYTES + split_bytes as usize;
        for (entry, (version, checksum, fill)) in body[4..].chunks_exact(entry_bytes).zip(&entries) {
            let meta = SplitMeta::decode(entry[..SPLIT_META_BYTES].try_into().unwrap()).unwrap();
            prop_assert_eq!(meta, SplitMeta { version: *version, checksum: *checksum });
            prop_assert!(entry[SPLIT_META_BYTES..].iter().all(|b| b == fill));
        }
        prop_assert_eq!(fuzzing::decode_stream(&frame), 1);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_header_bytes_never_panic(bytes in any::<[u8; HEADER_BYTES]>()) {
        if let Ok(header) = FrameHeader::decode(&bytes) {
            prop_assert!(header.body_len <= MAX_BODY_BYTES);
            prop_assert!(header.kind.length_rule().admits(header.body_len));
            prop_assert_eq!(header.encode(), bytes);
        }
    }

    #[test]
    fn arbitrary_bodies_never_panic(
        kind in proptest::sample::select(Kind::ALL.to_vec()),
        body in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        if let Ok(control) = Control::decode_body(kind, &body) {
            let mut frame = Vec::new();
            control.encode(7, &mut frame);
            prop_assert_eq!(&frame[HEADER_BYTES..], &body[..]);
        }
    }

    #[test]
    fn arbitrary_prefixes_never_panic(
        prefix in any::<[u8; WRITE_SPLIT_PREFIX_BYTES]>(),
        meta in any::<[u8; SPLIT_META_BYTES]>(),
        count in any::<[u8; READ_SPLITS_COUNT_BYTES]>(),
    ) {
        if let Ok(decoded) = WriteSplitPrefix::decode(&prefix) {
            prop_assert_eq!(decoded.encode(), prefix);
        }
        if let Ok(decoded) = SplitMeta::decode(&meta) {
            prop_assert_eq!(decoded.encode(), meta);
        }
        let _ = decode_read_splits_count(&count);
    }

    /// Random streams that start with a valid header so the body decoders get exercised, not only
    /// the magic check.
    #[test]
    fn arbitrary_frame_streams_never_panic(
        kind in proptest::sample::select(Kind::ALL.to_vec()),
        body_len in 0u32..200,
        tail in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut stream = Vec::new();
        stream.extend_from_slice(&MAGIC.to_le_bytes());
        stream.push(PROTOCOL_VERSION);
        stream.push(kind as u8);
        stream.extend_from_slice(&body_len.to_le_bytes());
        stream.extend_from_slice(&[0u8; 8]);
        stream.extend_from_slice(&tail);
        fuzzing::decode_stream(&stream);
        fuzzing::decode_stream(&tail);
    }
}

#[test]
fn header_rejects_bad_magic_version_kind_and_lengths() {
    let good = FrameHeader { kind: Kind::Ping, body_len: 0, request_id: 9 }.encode();
    let mut bad = good;
    bad[0] = b'X';
    assert!(matches!(FrameHeader::decode(&bad), Err(DecodeError::BadMagic { .. })));
    let mut bad = good;
    bad[2] = PROTOCOL_VERSION - 1;
    assert_eq!(FrameHeader::decode(&bad), Err(DecodeError::BadVersion { found: PROTOCOL_VERSION - 1 }));
    let mut bad = good;
    bad[3] = 23;
    assert_eq!(FrameHeader::decode(&bad), Err(DecodeError::UnknownKind { found: 23 }));
    let mut bad = good;
    bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(FrameHeader::decode(&bad), Err(DecodeError::BodyTooLong { kind: Kind::Ping, .. })));
    let mut bad = good;
    bad[4] = 1;
    assert_eq!(
        FrameHeader::decode(&bad),
        Err(DecodeError::BadLength { kind: Kind::Ping, expected: LengthRule::Exact(0), actual: 1 })
    );
    let mut bad = FrameHeader { kind: Kind::WriteSplit, body_len: 16, request_id: 1 }.encode();
    bad[4] = 15;
    assert!(matches!(FrameHeader::decode(&bad), Err(DecodeError::BadLength { kind: Kind::WriteSplit, .. })));
}

#[test]
fn control_decoder_rejects_inner_inconsistencies() {
    // Error whose message_len disagrees with the body.
    let mut body = Vec::new();
    body.extend_from_slice(&(ErrorCode::Malformed as u16).to_le_bytes());
    body.extend_from_slice(&5u16.to_le_bytes());
    body.extend_from_slice(b"abc");
    assert!(matches!(Control::decode_body(Kind::Error, &body), Err(DecodeError::InnerLength { .. })));
    // Unknown error code.
    let body = [99, 0, 0, 0];
    assert_eq!(Control::decode_body(Kind::Error, &body), Err(DecodeError::UnknownErrorCode { found: 99 }));
    // Invalid UTF-8.
    let body = [1, 0, 1, 0, 0xff];
    assert_eq!(Control::decode_body(Kind::Error, &body), Err(DecodeError::BadUtf8 { kind: Kind::Error }));
    // MapSlab reserved bytes.
    let mut frame = Vec::new();
    Control::MapSlab { split_bytes: 512, split_index: 3, first_page: 0, range_id: 1 }.encode(0, &mut frame);
    frame[HEADER_BYTES + 6] = 1;
    assert_eq!(
        Control::decode_body(Kind::MapSlab, &frame[HEADER_BYTES..]),
        Err(DecodeError::ReservedNotZero { kind: Kind::MapSlab })
    );
    // ReadSplits count 0 and 257.
    for count in [0u32, 257] {
        let mut body = vec![0u8; 8];
        body.extend_from_slice(&count.to_le_bytes());
        assert!(matches!(
            Control::decode_body(Kind::ReadSplits, &body),
            Err(DecodeError::CountOutOfRange { .. })
        ));
    }
    // Payload kinds are not control messages.
    assert_eq!(
        Control::decode_body(Kind::WriteSplit, &[0u8; 16]),
        Err(DecodeError::NotControl { kind: Kind::WriteSplit })
    );
    // A body longer than its kind allows, given directly.
    assert!(matches!(Control::decode_body(Kind::Ping, &[0]), Err(DecodeError::BadLength { .. })));
}

#[test]
fn fault_and_regeneration_decoders_reject_out_of_range_fields() {
    let inject = |fault: u8, fraction_ppm: u32| {
        let mut body = vec![fault, 0, 0, 0];
        body.extend_from_slice(&[0u8; 8]);
        body.extend_from_slice(&fraction_ppm.to_le_bytes());
        body.extend_from_slice(&[0u8; 12]);
        body
    };
    assert!(Control::decode_body(Kind::InjectFault, &inject(1, 1_000_000)).is_ok());
    assert_eq!(
        Control::decode_body(Kind::InjectFault, &inject(0, 0)),
        Err(DecodeError::UnknownFault { found: 0 })
    );
    assert_eq!(
        Control::decode_body(Kind::InjectFault, &inject(5, 0)),
        Err(DecodeError::UnknownFault { found: 5 })
    );
    assert!(matches!(
        Control::decode_body(Kind::InjectFault, &inject(1, 1_000_001)),
        Err(DecodeError::FieldOutOfRange { field: "fraction_ppm", .. })
    ));
    let mut reserved = inject(1, 0);
    reserved[2] = 1;
    assert_eq!(
        Control::decode_body(Kind::InjectFault, &reserved),
        Err(DecodeError::ReservedNotZero { kind: Kind::InjectFault })
    );

    let source = RegenerationSource { split_index: 3, slab_id: 9, address: "10.0.0.1:7100".parse().unwrap() };
    let regenerate = Control::Regenerate {
        slab_id: 1,
        data_splits: 8,
        parity_splits: 2,
        page_bytes: 4096,
        pages: 100,
        sources: vec![source; 2],
    };
    let mut frame = Vec::new();
    regenerate.encode(5, &mut frame);
    let body = frame[HEADER_BYTES..].to_vec();
    assert_eq!(body.len(), 16 + 2 * REGENERATION_SOURCE_BYTES);
    assert_eq!(Control::decode_body(Kind::Regenerate, &body), Ok(regenerate));
    // source_count disagreeing with the entries, or zero.
    for count in [0u8, 1, 3] {
        let mut bad = body.clone();
        bad[6] = count;
        assert!(Control::decode_body(Kind::Regenerate, &bad).is_err(), "source_count {count}");
    }
    // Reserved bytes in the fixed part and in an entry.
    for at in [7, 16 + 1, 16 + 26] {
        let mut bad = body.clone();
        bad[at] = 1;
        assert_eq!(
            Control::decode_body(Kind::Regenerate, &bad),
            Err(DecodeError::ReservedNotZero { kind: Kind::Regenerate }),
            "byte {at}"
        );
    }
    // IPv4 travels IPv4-mapped.
    assert_eq!(&body[16 + 8..16 + 24], &std::net::Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets());
}

#[test]
fn write_split_prefix_rejects_version_zero_and_reserved_bytes() {
    let mut bytes = WriteSplitPrefix { slab_id: 1, slot: 2, version: 3, checksum: 4 }.encode();
    bytes[10] = 1;
    assert!(matches!(WriteSplitPrefix::decode(&bytes), Err(DecodeError::ReservedNotZero { .. })));
    let mut bytes = WriteSplitPrefix { slab_id: 1, slot: 2, version: 3, checksum: 4 }.encode();
    bytes[8] = 0;
    assert_eq!(WriteSplitPrefix::decode(&bytes), Err(DecodeError::ZeroVersion));
}

#[test]
fn long_error_messages_are_truncated_at_a_char_boundary() {
    let message = "é".repeat(200); // 400 bytes
    let mut frame = Vec::new();
    Control::error(ErrorCode::Internal, message).encode(0, &mut frame);
    let Control::Error { message, .. } = Control::decode_body(Kind::Error, &frame[HEADER_BYTES..]).unwrap()
    else {
        panic!("not an Error");
    };
    assert_eq!(message.len(), 256);
}

#[test]
fn split_checksum_binds_payload_version_page_and_index() {
    let payload = [7u8; 512];
    let base = split_checksum(&payload, 1, 42, 3);
    assert_ne!(base, split_checksum(&payload, 2, 42, 3));
    assert_ne!(base, split_checksum(&payload, 1, 43, 3));
    assert_ne!(base, split_checksum(&payload, 1, 42, 4));
    let mut other = payload;
    other[100] ^= 1;
    assert_ne!(base, split_checksum(&other, 1, 42, 3));
    // Known answer: the checksum is crc32c over the concatenation.
    let mut concatenated = payload.to_vec();
    concatenated.push(1);
    concatenated.extend_from_slice(&42u64.to_le_bytes());
    concatenated.push(3);
    assert_eq!(base, crc32c::crc32c(&concatenated));
}

#[test]
fn versions_wrap_from_255_to_1_and_compare_as_serial_numbers() {
    assert_eq!(next_version(0), 1);
    assert_eq!(next_version(1), 2);
    assert_eq!(next_version(254), 255);
    assert_eq!(next_version(255), 1);
    assert!(version_is_newer(1, 255));
    assert!(!version_is_newer(255, 1));
    assert!(version_is_newer(1, 0));
    assert!(!version_is_newer(0, 1));
    assert!(!version_is_newer(0, 0));
    assert!(!version_is_newer(5, 5));
    for than in 0..=255u8 {
        assert!(version_is_newer(next_version(than), than));
        for candidate in 0..=255u8 {
            assert!(!(version_is_newer(candidate, than) && version_is_newer(than, candidate)));
            if candidate != than && candidate != 0 && than != 0 {
                assert!(version_is_newer(candidate, than) || version_is_newer(than, candidate));
            }
        }
    }
    // 127 steps ahead is newer, 128 steps ahead is older.
    let mut v = 200u8;
    for _ in 0..127 {
        v = next_version(v);
    }
    assert!(version_is_newer(v, 200));
    assert!(!version_is_newer(next_version(v), 200));
}

#[test]
fn read_splits_limits_fit_one_frame() {
    assert_eq!(max_read_splits_count(512), 256);
    assert!(max_read_splits_count(4096) < 256);
    assert_eq!(max_read_splits_count(MAX_SPLIT_BYTES), 1);
    for split_bytes in [64u32, 512, 4096, 65536, MAX_SPLIT_BYTES] {
        let count = max_read_splits_count(split_bytes);
        assert!(read_splits_reply_body_len(count, split_bytes).is_some());
        if count < READ_SPLITS_MAX_COUNT {
            assert!(read_splits_reply_body_len(count + 1, split_bytes).is_none());
        }
    }
}

#[test]
fn proofs_differ_by_role_and_verify_in_constant_time() {
    let secret = Secret::from_bytes(b"0123456789abcdef".to_vec()).unwrap();
    let other = Secret::from_bytes(b"0123456789abcdeX".to_vec()).unwrap();
    let (client_nonce, node_nonce) = ([1u8; 32], [2u8; 32]);
    let node = auth::node_proof(&secret, &client_nonce, &node_nonce, 5);
    let client = auth::client_proof(&secret, &client_nonce, &node_nonce, 5);
    assert_ne!(node, client);
    assert!(auth::verify(&node, &auth::node_proof(&secret, &client_nonce, &node_nonce, 5)));
    assert!(!auth::verify(&node, &auth::node_proof(&other, &client_nonce, &node_nonce, 5)));
    assert!(!auth::verify(&node, &auth::node_proof(&secret, &client_nonce, &node_nonce, 6)));
    assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
}

#[test]
fn secrets_load_from_file_trimming_one_newline_and_reject_short_ones() {
    assert!(matches!(Secret::from_bytes(vec![1; 15]), Err(auth::SecretError::TooShort { len: 15 })));
    let dir = std::env::temp_dir().join(format!("remem-proto-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("secret");
    std::fs::write(&path, b"0123456789abcdef\r\n").unwrap();
    // Readable by others: refused, whatever it holds.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(Secret::load(Some(&path)), Err(auth::SecretError::Readable { mode: 0o644, .. })));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let loaded = Secret::load(Some(&path)).unwrap();
    let expected = Secret::from_bytes(b"0123456789abcdef".to_vec()).unwrap();
    let proof = |s: &Secret| auth::node_proof(s, &[0; 32], &[0; 32], 0);
    assert_eq!(proof(&loaded), proof(&expected));
    std::fs::write(&path, b"short\n").unwrap();
    assert!(matches!(Secret::load(Some(&path)), Err(auth::SecretError::TooShort { len: 5 })));
    assert!(matches!(Secret::load(Some(&dir.join("absent"))), Err(auth::SecretError::Read { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn slab_exported_rejects_layouts_other_than_the_computed_one_and_epoch_zero() {
    let layout = ShmLayout::new(64 << 20, 512).expect("valid sizes");
    assert_eq!(layout.slots, 131_072);
    assert_eq!(layout.checksums_offset, 64 << 20);
    assert_eq!(layout.versions_offset, (64 << 20) + 4 * 131_072);
    // 5 bytes per slot plus the header page: under 1% of a 64 MiB slab.
    assert!(layout.metadata_bytes() * 100 < layout.slab_bytes, "{} metadata bytes", layout.metadata_bytes());
    let message = Control::SlabExported { slab_id: 7, epoch: 3, layout };
    let mut frame = Vec::new();
    message.encode(5, &mut frame);
    let body = &frame[HEADER_BYTES..];
    assert_eq!(Control::decode_body(Kind::SlabExported, body), Ok(message));

    // Every layout field lies about the memfd in turn: each is refused.
    for field_at in [24usize, 32, 40, 48, 56] {
        let mut bad = body.to_vec();
        bad[field_at] ^= 0x40;
        assert_eq!(
            Control::decode_body(Kind::SlabExported, &bad),
            Err(DecodeError::BadLayout { kind: Kind::SlabExported }),
            "field at {field_at}"
        );
    }
    let mut bad = body.to_vec();
    bad[8] ^= 1; // slots
    assert_eq!(
        Control::decode_body(Kind::SlabExported, &bad),
        Err(DecodeError::BadLayout { kind: Kind::SlabExported })
    );
    let mut bad = body.to_vec();
    bad[4..8].copy_from_slice(&100u32.to_le_bytes()); // split_bytes not a power of two
    assert_eq!(
        Control::decode_body(Kind::SlabExported, &bad),
        Err(DecodeError::BadLayout { kind: Kind::SlabExported })
    );
    let mut bad = body.to_vec();
    bad[12] = 1; // reserved
    assert_eq!(
        Control::decode_body(Kind::SlabExported, &bad),
        Err(DecodeError::ReservedNotZero { kind: Kind::SlabExported })
    );
    let mut bad = body.to_vec();
    bad[16..24].copy_from_slice(&0u64.to_le_bytes());
    assert!(matches!(
        Control::decode_body(Kind::SlabExported, &bad),
        Err(DecodeError::FieldOutOfRange { field: "epoch", .. })
    ));
    // Wrong lengths never reach the field decoder.
    assert!(Control::decode_body(Kind::SlabExported, &body[..63]).is_err());
    assert!(Control::decode_body(Kind::ExportSlab, &[0u8; 5]).is_err());
    assert_eq!(
        Control::decode_body(Kind::ExportSlab, &9u32.to_le_bytes()),
        Ok(Control::ExportSlab { slab_id: 9 })
    );
}

#[test]
fn slab_activity_decoders_check_length_and_reserved_bytes() {
    let mut frame = Vec::new();
    Control::SlabActivity { slab_id: 3, accesses: 77 }.encode(5, &mut frame);
    let body = &frame[remem_proto::HEADER_BYTES..];
    assert_eq!(body.len(), 16);
    assert_eq!(
        Control::decode_body(Kind::SlabActivity, body),
        Ok(Control::SlabActivity { slab_id: 3, accesses: 77 })
    );
    let mut bad = body.to_vec();
    bad[5] = 1;
    assert!(Control::decode_body(Kind::SlabActivity, &bad).is_err(), "reserved bytes must be zero");
    assert!(Control::decode_body(Kind::SlabActivity, &body[..15]).is_err());
    assert!(Control::decode_body(Kind::SlabActivityQuery, &[0u8; 3]).is_err());
    assert!(Control::decode_body(Kind::AnswerActivity, &[0u8; 1]).is_err());
    assert_eq!(Control::decode_body(Kind::AnswerActivity, &[]), Ok(Control::AnswerActivity));
}

#[test]
fn shm_layouts_reject_bad_sizes() {
    assert_eq!(ShmLayout::new(4096, 8192), None);
    assert_eq!(ShmLayout::new(4096 + 1, 512), None);
    assert_eq!(ShmLayout::new(1 << 33, 512), None);
    assert_eq!(ShmLayout::new(1 << 20, 32), None);
    let small = ShmLayout::new(4096, 64).expect("one page of 64-byte splits");
    assert_eq!(small.total_bytes % 4096, 0);
    assert!(small.header_offset >= small.versions_offset + u64::from(small.slots));
}
