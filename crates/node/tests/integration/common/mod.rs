//! A node running in-process on 127.0.0.1:0, and a blocking test client for it.

#![allow(dead_code)]

use remem_node::{Node, NodeConfig, NodeHandle};
use remem_proto::auth::Secret;
use remem_proto::blocking::{self, FrameError};
use remem_proto::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub const SECRET: &[u8] = b"remem-test-secret-0123456789";
pub const NODE_ID: u64 = 77;
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

pub fn secret() -> Secret {
    Secret::from_bytes(SECRET.to_vec()).unwrap()
}

/// A node serving in a background thread; stopped and joined on drop.
pub struct TestNode {
    pub addr: SocketAddr,
    pub handle: NodeHandle,
    shutdown: Arc<AtomicBool>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestNode {
    pub fn start(capacity_bytes: u64, slab_size_bytes: u64) -> TestNode {
        TestNode::start_with(capacity_bytes, slab_size_bytes, 64)
    }

    pub fn start_with(capacity_bytes: u64, slab_size_bytes: u64, max_connections: usize) -> TestNode {
        TestNode::start_config(capacity_bytes, slab_size_bytes, max_connections, false)
    }

    /// A node that accepts `InjectFault`.
    pub fn start_with_faults(capacity_bytes: u64, slab_size_bytes: u64) -> TestNode {
        TestNode::start_config(capacity_bytes, slab_size_bytes, 64, true)
    }

    pub fn start_config(
        capacity_bytes: u64,
        slab_size_bytes: u64,
        max_connections: usize,
        fault_injection: bool,
    ) -> TestNode {
        TestNode::start_node(capacity_bytes, slab_size_bytes, max_connections, fault_injection, false)
    }

    /// A node that requires encryption on TCP (`--encrypt`).
    pub fn start_encrypted(capacity_bytes: u64, slab_size_bytes: u64) -> TestNode {
        TestNode::start_node(capacity_bytes, slab_size_bytes, 64, false, true)
    }

    fn start_node(
        capacity_bytes: u64,
        slab_size_bytes: u64,
        max_connections: usize,
        fault_injection: bool,
        encrypt: bool,
    ) -> TestNode {
        let node = Node::bind(NodeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            capacity_bytes,
            slab_size_bytes,
            failure_domain: "rack-1".to_owned(),
            secret: secret(),
            node_id: NODE_ID,
            max_connections,
            fault_injection,
            resource_monitor: None,
            unix_socket: None,
            lease_grace: remem_node::leases::DEFAULT_LEASE_GRACE,
            lease_timeout: remem_node::leases::DEFAULT_LEASE_TIMEOUT,
            encrypt,
        })
        .unwrap();
        let addr = node.local_addr();
        let handle = node.handle();
        let shutdown = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&shutdown);
        let thread = std::thread::spawn(move || node.run(flag));
        TestNode { addr, handle, shutdown, thread: Some(thread) }
    }

    /// A raw TCP connection with timeouts, not yet authenticated.
    pub fn connect_raw(&self) -> TcpStream {
        let stream = TcpStream::connect(self.addr).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        stream
    }

    pub fn client(&self, client_id: u64) -> Client {
        let mut stream = self.connect_raw();
        let node_id = blocking::handshake(&mut stream, &secret(), client_id).unwrap();
        assert_eq!(node_id, NODE_ID);
        Client { stream, next_request_id: 100, body: Vec::new() }
    }

    pub fn stop(mut self) {
        self.stop_in_place();
    }

    fn stop_in_place(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("node thread panicked").expect("node run failed");
        }
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.stop_in_place();
    }
}

pub struct Client {
    pub stream: TcpStream,
    next_request_id: u64,
    pub body: Vec<u8>,
}

impl Client {
    /// Wraps an authenticated stream.
    pub fn new(stream: TcpStream) -> Client {
        Client { stream, next_request_id: 100, body: Vec::new() }
    }

    pub fn request_id(&mut self) -> u64 {
        self.next_request_id += 1;
        self.next_request_id
    }

    /// Sends a control request and returns the control reply, checking the echoed request id.
    pub fn call(&mut self, request: &Control) -> Control {
        let request_id = self.request_id();
        blocking::write_control(&mut self.stream, request_id, request).unwrap();
        let (header, reply) = blocking::read_control(&mut self.stream, &mut self.body).unwrap();
        assert_eq!(header.request_id, request_id);
        reply
    }

    pub fn map_slab(&mut self, split_bytes: u32, split_index: u8, first_page: u64) -> (u32, u32) {
        match self.call(&Control::MapSlab { split_bytes, split_index, first_page, range_id: 1 }) {
            Control::SlabMapped { slab_id, slots } => (slab_id, slots),
            other => panic!("MapSlab answered {other:?}"),
        }
    }

    pub fn send_write_split(&mut self, prefix: &WriteSplitPrefix, payload: &[u8]) -> u64 {
        let request_id = self.request_id();
        let mut frame = Vec::new();
        encode_write_split(request_id, prefix, payload, &mut frame);
        self.stream.write_all(&frame).unwrap();
        request_id
    }

    pub fn write_split(&mut self, prefix: &WriteSplitPrefix, payload: &[u8]) -> Control {
        let request_id = self.send_write_split(prefix, payload);
        let (header, reply) = blocking::read_control(&mut self.stream, &mut self.body).unwrap();
        assert_eq!(header.request_id, request_id);
        reply
    }

    /// ReadSplit: Ok((meta, payload)) or Err(the Error reply).
    pub fn read_split(&mut self, slab_id: u32, slot: u32) -> Result<(SplitMeta, Vec<u8>), Control> {
        let request_id = self.request_id();
        blocking::write_control(&mut self.stream, request_id, &Control::ReadSplit { slab_id, slot }).unwrap();
        let header = blocking::read_frame(&mut self.stream, &mut self.body).unwrap();
        assert_eq!(header.request_id, request_id);
        match header.kind {
            Kind::ReadSplitReply => {
                let meta = SplitMeta::decode(self.body[..SPLIT_META_BYTES].try_into().unwrap()).unwrap();
                Ok((meta, self.body[SPLIT_META_BYTES..].to_vec()))
            }
            kind => Err(Control::decode_body(kind, &self.body).unwrap()),
        }
    }

    /// Expects the node to answer with Error(code) and then close the connection.
    pub fn expect_error_and_close(&mut self, code: ErrorCode) {
        expect_error_and_close(&mut self.stream, code);
    }
}

/// Reads an `Error` frame with `code`, then end of stream.
pub fn expect_error_and_close(stream: &mut TcpStream, code: ErrorCode) {
    let mut body = Vec::new();
    match blocking::read_control(stream, &mut body) {
        Ok((_, Control::Error { code: got, .. })) => assert_eq!(got, code),
        other => panic!("expected Error({code:?}), got {other:?}"),
    }
    expect_closed(stream);
}

/// The node closed the connection: end of stream (or a reset) before any further frame.
pub fn expect_closed(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => {}
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected a closed connection, got {other:?}"),
    }
}

pub fn is_closed(result: &Result<(FrameHeader, Control), FrameError>) -> bool {
    matches!(result, Err(FrameError::Closed))
}

pub fn checksummed_payload(
    split_bytes: u32,
    fill: u8,
    version: u8,
    page: u64,
    split_index: u8,
) -> (Vec<u8>, u32) {
    let payload: Vec<u8> = (0..split_bytes).map(|i| fill.wrapping_add(i as u8)).collect();
    let checksum = split_checksum(&payload, version, page, split_index);
    (payload, checksum)
}

static CONNECTION_PANICKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Records panics of node connection threads, which the node itself survives silently.
pub fn detect_connection_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name().is_some_and(|name| name.starts_with("remem-conn")) {
                CONNECTION_PANICKED.store(true, Ordering::SeqCst);
            }
            default_hook(info);
        }));
    });
}

pub fn assert_no_connection_panicked() {
    assert!(!CONNECTION_PANICKED.load(Ordering::SeqCst), "a node connection thread panicked");
}
