//! A node with `--encrypt` (`NodeConfig::encrypt`) over real sockets: the Noise handshake, then
//! the usual handshake and requests inside it; a tampered ciphertext byte closes the
//! connection; a plaintext client is refused in plaintext with the reason.

use crate::common::*;
use remem_proto::blocking::{self, HandshakeError};
use remem_proto::encryption;
use remem_proto::{Control, ErrorCode};
use std::io::{Read, Write};

#[test]
fn an_encrypted_connection_is_served_and_a_tampered_byte_closes_it() {
    let node = TestNode::start_encrypted(16 << 20, 1 << 20);
    let mut stream = encryption::initiate(node.connect_raw(), &secret()).expect("the node encrypts");
    assert_eq!(blocking::handshake(&mut stream, &secret(), 5).expect("authenticated inside"), NODE_ID);
    blocking::write_control(&mut stream, 9, &Control::NodeInfo).expect("request");
    let mut body = Vec::new();
    let (header, reply) = blocking::read_control(&mut stream, &mut body).expect("reply");
    assert_eq!(header.request_id, 9);
    assert!(matches!(reply, Control::NodeInfoReply(_)), "{reply:?}");
    // The network flips one bit of the next message: the node closes without answering.
    let (mut raw, mut sealer, _) = stream.into_parts();
    let mut frame = Vec::new();
    Control::NodeInfo.encode(10, &mut frame);
    let mut sealed = Vec::new();
    sealer.seal(&frame, &mut sealed).expect("seal");
    sealed[encryption::LENGTH_BYTES + 4] ^= 0x01;
    raw.write_all(&sealed).expect("write");
    let mut buf = [0u8; 64];
    match raw.read(&mut buf) {
        Ok(0) => {}
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the connection must close, got {other:?}"),
    }
    // The node goes on serving others.
    let mut again = encryption::initiate(node.connect_raw(), &secret()).expect("the node encrypts");
    blocking::handshake(&mut again, &secret(), 6).expect("a new connection is served");
}

#[test]
fn a_plaintext_hello_to_an_encrypted_node_is_refused_in_plaintext() {
    let node = TestNode::start_encrypted(16 << 20, 1 << 20);
    let mut stream = node.connect_raw();
    match blocking::handshake(&mut stream, &secret(), 5) {
        Err(HandshakeError::Rejected { code: ErrorCode::NotAuthenticated, message }) => {
            assert!(message.contains("requires encrypted TCP connections"), "{message}")
        }
        other => panic!("a plaintext client must be refused, got {other:?}"),
    }
}

#[test]
fn a_plaintext_node_refuses_an_encrypting_client_in_plaintext() {
    let node = TestNode::start(16 << 20, 1 << 20);
    match encryption::initiate(node.connect_raw(), &secret()) {
        Err(error @ encryption::EncryptionError::PlaintextNode { code: ErrorCode::Unsupported, .. }) => {
            assert!(error.to_string().contains("does not encrypt"), "{error}")
        }
        Err(other) => panic!("expected the node's plaintext refusal, got {other}"),
        Ok(_) => panic!("a plaintext node must refuse encryption"),
    }
}
