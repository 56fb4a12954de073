//! Connection buffers are bounded: they shrink when a connection goes quiet, frames that do not
//! fit the node-wide budget are refused, and the budget is whole again once connections close.

use crate::common;

use common::*;
use remem_proto::{FrameHeader, Kind, HEADER_BYTES, MAX_BODY_BYTES};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Waits up to `limit` for `condition`; true if it held.
fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

fn header(kind: Kind, body_len: u32, request_id: u64) -> [u8; HEADER_BYTES] {
    FrameHeader { kind, body_len, request_id }.encode()
}

#[test]
fn a_busy_connection_grows_its_buffer_and_gives_it_back_once_idle() {
    let node = TestNode::start(4 << 20, 1 << 20);
    let mut client = node.client(1);
    // 300 KiB of Pongs: no replies, and more than the small buffer per read.
    let pongs: Vec<u8> = (0..19_200).flat_map(|id| header(Kind::Pong, 0, id)).collect();
    client.stream.write_all(&pongs).unwrap();
    assert!(
        eventually(Duration::from_millis(900), || node.handle.connection_buffer_bytes() > 0),
        "a busy connection never grew its input buffer"
    );
    let grown = node.handle.connection_buffer_bytes();
    assert!(grown <= remem_node::INPUT_BUFFER_BYTES, "grew to {grown} bytes");
    assert!(
        eventually(remem_node::IDLE_SHRINK_AFTER * 3, || node.handle.connection_buffer_bytes() == 0),
        "an idle connection still holds {} buffer bytes",
        node.handle.connection_buffer_bytes()
    );
    // Still served after shrinking.
    assert_eq!(client.call(&remem_proto::Control::Ping), remem_proto::Control::Pong);
}

#[test]
fn frames_past_the_node_wide_budget_are_refused_and_the_budget_returns_when_they_close() {
    let node = TestNode::start_with(4 << 20, 1 << 20, 200);
    let frame_bytes = HEADER_BYTES + MAX_BODY_BYTES as usize;
    let fit = remem_node::CONNECTION_BUFFER_BUDGET_BYTES / (frame_bytes - remem_node::SMALL_INPUT_BYTES);
    let mut clients: Vec<Client> = (0..fit + 10).map(|id| node.client(id as u64 + 1)).collect();
    // Every frame announced within well under `PARTIAL_FRAME_TIMEOUT`.
    for client in &mut clients {
        client.stream.write_all(&header(Kind::WriteSplit, MAX_BODY_BYTES, 7)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut parked = Vec::new();
    let mut refused = 0;
    for mut client in clients {
        // A refusal has come back by now; a parked frame gets no reply.
        client.stream.set_nonblocking(true).unwrap();
        let mut reply = [0u8; 512];
        match client.stream.read(&mut reply) {
            Ok(n) if n >= HEADER_BYTES => {
                let reply_header = FrameHeader::decode(reply[..HEADER_BYTES].try_into().unwrap()).unwrap();
                assert_eq!(reply_header.kind, Kind::Error);
                refused += 1;
            }
            _ => parked.push(client),
        }
    }
    assert_eq!(parked.len(), fit, "{refused} refused");
    assert_eq!(refused, 10);
    let used = node.handle.connection_buffer_bytes();
    assert!(used <= remem_node::CONNECTION_BUFFER_BUDGET_BYTES, "{used} bytes past the budget");
    drop(parked);
    assert!(
        eventually(Duration::from_secs(3), || node.handle.connection_buffer_bytes() == 0),
        "closed connections left {} bytes charged",
        node.handle.connection_buffer_bytes()
    );
}
