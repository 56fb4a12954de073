use super::*;
use crate::fuzzing::Xorshift;
use crate::Control;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

fn secret(byte: u8) -> Secret {
    Secret::from_bytes(vec![byte; 32]).expect("32 bytes")
}

/// A client and a node end, handshake done, over a socket pair.
fn pair() -> (SecureStream<UnixStream>, SecureStream<UnixStream>) {
    let (client, node) = UnixStream::pair().expect("socket pair");
    let node = std::thread::spawn(move || accept(node, &secret(7)).expect("node accepts"));
    let client = initiate(client, &secret(7)).expect("client initiates");
    (client, node.join().expect("node thread"))
}

#[test]
fn bytes_cross_both_ways_in_messages_of_any_size() {
    let (mut client, mut node) = pair();
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let writer = std::thread::spawn(move || {
        client.write_all(&big).expect("client writes");
        client.write_all(b"x").expect("client writes");
        let mut back = [0u8; 5];
        client.read_exact(&mut back).expect("client reads");
        assert_eq!(&back, b"hello");
    });
    let mut got = vec![0u8; 200_001];
    node.read_exact(&mut got).expect("node reads");
    let expected: Vec<u8> = (0..200_000u32).map(|i| (i * 31 % 251) as u8).chain([b'x']).collect();
    assert!(got == expected, "every byte arrives in order");
    node.write_all(b"hello").expect("node writes");
    writer.join().expect("writer thread");
}

#[test]
fn a_wrong_secret_fails_the_handshake_on_both_ends() {
    let (client, node) = UnixStream::pair().expect("socket pair");
    let node = std::thread::spawn(move || accept(node, &secret(8)).err());
    let client_error = initiate(client, &secret(7)).err().expect("the client fails");
    let node_error = node.join().expect("node thread").expect("the node fails");
    assert!(matches!(node_error, EncryptionError::HandshakeFailed), "{node_error}");
    // The node closed without answering: the client sees the end of the stream.
    assert!(matches!(client_error, EncryptionError::Io(_)), "{client_error}");
}

#[test]
fn a_tampered_ciphertext_byte_closes_the_connection() {
    let (client, node) = UnixStream::pair().expect("socket pair");
    let node = std::thread::spawn(move || accept(node, &secret(7)).expect("node accepts"));
    let client = initiate(client, &secret(7)).expect("client initiates");
    let mut node = node.join().expect("node thread");
    let (mut raw, mut sealer, _) = client.into_parts();
    let mut sealed = Vec::new();
    sealer.seal(b"a frame the network changes", &mut sealed).expect("seal");
    sealed[LENGTH_BYTES + 3] ^= 0x20;
    raw.write_all(&sealed).expect("write");
    let error = node.read(&mut [0u8; 64]).expect_err("an altered message is refused");
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
    assert!(error.to_string().contains("did not authenticate"), "{error}");
}

#[test]
fn a_replayed_message_does_not_authenticate() {
    let (client, node) = UnixStream::pair().expect("socket pair");
    let node = std::thread::spawn(move || accept(node, &secret(7)).expect("node accepts"));
    let client = initiate(client, &secret(7)).expect("client initiates");
    let mut node = node.join().expect("node thread");
    let (mut raw, mut sealer, _) = client.into_parts();
    let mut sealed = Vec::new();
    sealer.seal(b"once", &mut sealed).expect("seal");
    raw.write_all(&sealed).expect("write");
    raw.write_all(&sealed).expect("write again");
    let mut got = [0u8; 4];
    node.read_exact(&mut got).expect("the first copy opens");
    assert!(node.read(&mut got).is_err(), "the copy is refused: its nonce is spent");
}

#[test]
fn a_plaintext_node_is_named_in_the_error() {
    let (client, mut node) = UnixStream::pair().expect("socket pair");
    let node = std::thread::spawn(move || {
        let mut opening = [0u8; OPENING_BYTES];
        node.read_exact(&mut opening).expect("opening");
        let mut frame = Vec::new();
        Control::error(ErrorCode::Unsupported, "this node does not encrypt").encode(0, &mut frame);
        node.write_all(&frame).expect("reply");
    });
    let error = initiate(client, &secret(7)).err().expect("refused");
    node.join().expect("node thread");
    assert!(matches!(error, EncryptionError::PlaintextNode { code: ErrorCode::Unsupported, .. }), "{error}");
    assert!(error.to_string().contains("this node does not encrypt"), "{error}");
}

#[test]
fn a_plaintext_opening_is_no_preamble() {
    let mut opening = [0u8; OPENING_BYTES];
    opening[..2].copy_from_slice(&crate::MAGIC.to_le_bytes());
    let error = respond(&secret(7), &opening, &mut Vec::new()).err().expect("refused");
    assert!(matches!(error, EncryptionError::NoPreamble { .. }), "{error}");
}

/// Plaintext handed out into buffers smaller than a message, and messages larger than the
/// room left, come out whole and in order.
#[test]
fn inbound_hands_out_messages_into_any_room() {
    let (client, node) = UnixStream::pair().expect("socket pair");
    let node = std::thread::spawn(move || accept(node, &secret(7)).expect("node accepts"));
    let client = initiate(client, &secret(7)).expect("client initiates");
    let (_, opener) = node.join().expect("node thread").into_parts_for_test();
    let (_, mut sealer, _) = client.into_parts();
    let mut inbound = Inbound::new(opener);
    let plaintext: Vec<u8> = (0..150_000u32).map(|i| (i % 253) as u8).collect();
    let mut sealed = Vec::new();
    for piece in plaintext.chunks(7_000) {
        sealer.seal(piece, &mut sealed).expect("seal");
    }
    let mut random = Xorshift::new(5);
    let (mut fed, mut got) = (0, Vec::new());
    while got.len() < plaintext.len() {
        let room = 1 + random.below(9_000) as usize;
        let mut out = vec![0u8; room];
        let taken = inbound.take_plaintext(&mut out).expect("authentic");
        got.extend_from_slice(&out[..taken]);
        if taken == 0 {
            let spare = inbound.spare();
            let count = spare.len().min(sealed.len() - fed).min(1 + random.below(20_000) as usize);
            spare[..count].copy_from_slice(&sealed[fed..fed + count]);
            inbound.received(count);
            fed += count;
        }
    }
    assert!(got == plaintext);
    assert!(inbound.is_empty());
}

/// Random bytes after a good handshake never panic the receiver: each is refused.
#[test]
fn inbound_refuses_garbage_without_panicking() {
    let mut random = Xorshift::new(11);
    for _ in 0..200 {
        let (client, node) = (secret(1), secret(1));
        let mut opening = Vec::new();
        let initiator = Initiator::start(&client, &mut opening);
        let mut reply = Vec::new();
        let (_, opener) =
            respond(&node, &opening[..].try_into().expect("opening"), &mut reply).expect("respond");
        initiator.finish(&reply[LENGTH_BYTES..]).expect("finish");
        let mut inbound = Inbound::new(opener);
        let len = random.below(300) as usize;
        let spare = inbound.spare();
        for byte in &mut spare[..len] {
            *byte = random.below(256) as u8;
        }
        inbound.received(len);
        let mut out = [0u8; 512];
        if let Ok(taken) = inbound.take_plaintext(&mut out) {
            assert_eq!(taken, 0, "nothing forged authenticates");
        }
    }
}

impl SecureStream<UnixStream> {
    fn into_parts_for_test(self) -> (Sealer, Opener) {
        let (_, sealer, inbound) = self.into_parts();
        (sealer, inbound.opener)
    }
}

/// The stable stand-in of the `open_messages` fuzz target: generated and mutated inputs.
#[test]
fn open_messages_fuzz_body_holds_on_generated_inputs() {
    let mut random = Xorshift::new(27);
    let mut data = Vec::new();
    for _ in 0..300 {
        let len = random.below(3_000) as usize;
        data.clear();
        data.extend((0..len).map(|_| random.below(256) as u8));
        crate::fuzzing::open_messages(&data);
        random.mutate(&mut data, &[0, 0x30, 0xff]);
        crate::fuzzing::open_messages(&data);
    }
}
