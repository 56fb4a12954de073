//! Whole-connection tests: a scripted client on one end of a Unix socket pair, the server
//! (handshake + transmission) on the other, the in-memory store behind it, and a flat byte
//! vector as the reference model of the export.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use proptest::prelude::*;

use crate::handshake::tests::{go_data, option};
use crate::protocol::*;
use crate::server::{serve_connection, ServerConfig, Stream};
use crate::shards::{ShardLayout, Shards, SharedStore};
use crate::store::MemoryStore;
use crate::Export;

const PAGE: usize = 4096;
const PAGES: u64 = 64;
const SIZE: u64 = PAGES * PAGE as u64;

fn config() -> ServerConfig {
    let export = Export {
        name: "disk".into(),
        description: "model".into(),
        size_bytes: SIZE,
        max_request_bytes: 1 << 20,
        page_bytes: PAGE as u32,
    };
    let mut config = ServerConfig::new(export);
    config.limits.poll_interval_ms = 20;
    config
}

/// A reply as the client decodes it.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    handle: u64,
    error: u32,
    data: Vec<u8>,
}

struct TestClient {
    socket: UnixStream,
    structured: bool,
}

impl TestClient {
    /// Connects with `NBD_OPT_GO`, optionally negotiating structured replies first.
    fn connect(socket: UnixStream, structured: bool) -> TestClient {
        let mut client = TestClient { socket, structured };
        let mut greeting = [0u8; 18];
        client.socket.read_exact(&mut greeting).unwrap();
        let mut out = (CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes().to_vec();
        if structured {
            option(OPT_STRUCTURED_REPLY, &[], &mut out);
        }
        option(OPT_GO, &go_data(b"disk", &[INFO_BLOCK_SIZE]), &mut out);
        client.socket.write_all(&out).unwrap();
        if structured {
            assert_eq!(client.option_reply().1, REP_ACK);
        }
        loop {
            let (option, reply) = client.option_reply();
            assert_eq!(option, OPT_GO);
            if reply == REP_ACK {
                break;
            }
            assert_eq!(reply, REP_INFO);
        }
        client
    }

    fn option_reply(&mut self) -> (u32, u32) {
        let mut header = [0u8; 20];
        self.socket.read_exact(&mut header).unwrap();
        let length = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
        let mut payload = vec![0; length];
        self.socket.read_exact(&mut payload).unwrap();
        (
            u32::from_be_bytes(header[8..12].try_into().unwrap()),
            u32::from_be_bytes(header[12..16].try_into().unwrap()),
        )
    }

    fn send(&mut self, command: u16, flags: u16, handle: u64, offset: u64, length: u32, payload: &[u8]) {
        let mut out = Vec::new();
        encode_request(&RequestHeader { flags, command, handle, offset, length }, &mut out);
        out.extend_from_slice(payload);
        self.socket.write_all(&out).unwrap();
    }

    /// Reads one reply; `read_lengths` maps handles of reads to their lengths (simple replies
    /// carry no length).
    fn receive(&mut self, read_lengths: &std::collections::HashMap<u64, u32>) -> Reply {
        let mut magic = [0u8; 4];
        self.socket.read_exact(&mut magic).unwrap();
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => {
                let mut rest = [0u8; 12];
                self.socket.read_exact(&mut rest).unwrap();
                let error = u32::from_be_bytes(rest[0..4].try_into().unwrap());
                let handle = u64::from_be_bytes(rest[4..12].try_into().unwrap());
                let mut data = Vec::new();
                if error == 0 {
                    if let Some(&length) = read_lengths.get(&handle) {
                        assert!(!self.structured, "a read must get a structured reply");
                        data = vec![0; length as usize];
                        self.socket.read_exact(&mut data).unwrap();
                    }
                }
                Reply { handle, error, data }
            }
            STRUCTURED_REPLY_MAGIC => {
                let mut rest = [0u8; 16];
                self.socket.read_exact(&mut rest).unwrap();
                let flags = u16::from_be_bytes(rest[0..2].try_into().unwrap());
                let kind = u16::from_be_bytes(rest[2..4].try_into().unwrap());
                let handle = u64::from_be_bytes(rest[4..12].try_into().unwrap());
                let length = u32::from_be_bytes(rest[12..16].try_into().unwrap()) as usize;
                assert_ne!(flags & REPLY_FLAG_DONE, 0, "one chunk per reply");
                let mut payload = vec![0; length];
                self.socket.read_exact(&mut payload).unwrap();
                match kind {
                    REPLY_TYPE_NONE => Reply { handle, error: 0, data: Vec::new() },
                    REPLY_TYPE_OFFSET_DATA => Reply { handle, error: 0, data: payload[8..].to_vec() },
                    REPLY_TYPE_ERROR => {
                        let error = u32::from_be_bytes(payload[0..4].try_into().unwrap());
                        let message_bytes = u16::from_be_bytes(payload[4..6].try_into().unwrap()) as usize;
                        assert_eq!(message_bytes + 6, length);
                        Reply { handle, error, data: Vec::new() }
                    }
                    other => panic!("unexpected chunk type {other}"),
                }
            }
            other => panic!("bad reply magic {other:#x}"),
        }
    }
}

/// Runs `client_side` against a server on a socket pair with `store`; returns the store.
fn with_server(store: MemoryStore, client_side: impl FnOnce(UnixStream) + Send) -> MemoryStore {
    with_shared(Mutex::new(store), client_side).into_inner().unwrap()
}

/// [`with_server`] over any [`SharedStore`] (one store behind a lock, or engines).
fn with_shared<S: SharedStore>(store: S, client_side: impl FnOnce(UnixStream) + Send) -> S {
    let (server_end, client_end) = UnixStream::pair().unwrap();
    let stop = AtomicBool::new(false);
    let config = config();
    std::thread::scope(|scope| {
        let server =
            scope.spawn(|| serve_connection(Stream::Unix(server_end), &store, 1, &config, &stop, &|| true));
        client_side(client_end);
        // Hostile clients end their connection with an error; that is a result, not a failure.
        let _ = server.join().expect("the server thread does not panic");
    });
    store
}

#[derive(Clone, Debug)]
enum Op {
    Read { offset: u64, length: u32 },
    Write { offset: u64, length: u32, seed: u8 },
    Zero { offset: u64, length: u32 },
    Trim { offset: u64, length: u32 },
    Flush,
}

fn range() -> impl Strategy<Value = (u64, u32)> {
    (0..SIZE, 0u32..(3 * PAGE as u32))
        .prop_map(|(offset, length)| (offset, length.min((SIZE - offset) as u32)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => range().prop_map(|(offset, length)| Op::Read { offset, length }),
        4 => (range(), any::<u8>()).prop_map(|((offset, length), seed)| Op::Write { offset, length, seed }),
        1 => range().prop_map(|(offset, length)| Op::Zero { offset, length }),
        1 => range().prop_map(|(offset, length)| Op::Trim { offset, length }),
        1 => Just(Op::Flush),
    ]
}

fn payload(length: u32, seed: u8) -> Vec<u8> {
    (0..length).map(|index| seed.wrapping_add((index % 251) as u8) | 1).collect()
}

/// Sends `ops` pipelined (all at once), then checks every reply against the model: each op is
/// applied to the model in send order. Trimmed bytes are "unspecified" per the spec, so the
/// model tracks them and reads ignore them until rewritten.
fn run_against_model(ops: &[Op], structured: bool, engines: usize) {
    let mut model = vec![0u8; SIZE as usize];
    let mut unspecified = vec![false; SIZE as usize];
    let mut expected: Vec<(u64, Option<(u64, u32)>)> = Vec::new();
    let mut read_lengths = std::collections::HashMap::new();
    let ops = ops.to_vec();
    let client_side = |socket| {
        let mut client = TestClient::connect(socket, structured);
        for (index, op) in ops.iter().enumerate() {
            let handle = index as u64 + 1;
            match *op {
                Op::Read { offset, length } => {
                    client.send(CMD_READ, 0, handle, offset, length, &[]);
                    read_lengths.insert(handle, length);
                    expected.push((handle, Some((offset, length))));
                }
                Op::Write { offset, length, seed } => {
                    let data = payload(length, seed);
                    client.send(CMD_WRITE, CMD_FLAG_FUA, handle, offset, length, &data);
                    expected.push((handle, None));
                }
                Op::Zero { offset, length } => {
                    client.send(CMD_WRITE_ZEROES, 0, handle, offset, length, &[]);
                    expected.push((handle, None));
                }
                Op::Trim { offset, length } => {
                    client.send(CMD_TRIM, 0, handle, offset, length, &[]);
                    expected.push((handle, None));
                }
                Op::Flush => {
                    client.send(CMD_FLUSH, 0, handle, 0, 0, &[]);
                    expected.push((handle, None));
                }
            }
        }
        let mut replies = std::collections::HashMap::new();
        for _ in 0..ops.len() {
            let reply = client.receive(&read_lengths);
            assert_eq!(reply.error, 0, "request {} failed", reply.handle);
            assert!(replies.insert(reply.handle, reply).is_none(), "one reply per handle");
        }
        // Replay the model in send order; the server may reorder only requests that do not
        // conflict, so each read must see every earlier write.
        for (op, (handle, _)) in ops.iter().zip(&expected) {
            match *op {
                Op::Read { offset, length } => {
                    let got = &replies[handle].data;
                    assert_eq!(got.len(), length as usize);
                    for (index, byte) in got.iter().enumerate() {
                        let at = offset as usize + index;
                        if !unspecified[at] {
                            assert_eq!(*byte, model[at], "read {handle} byte {index} (offset {at})");
                        }
                    }
                }
                Op::Write { offset, length, seed } => {
                    let range = offset as usize..(offset + length as u64) as usize;
                    model[range.clone()].copy_from_slice(&payload(length, seed));
                    unspecified[range].fill(false);
                }
                Op::Zero { offset, length } => {
                    let range = offset as usize..(offset + length as u64) as usize;
                    model[range.clone()].fill(0);
                    unspecified[range].fill(false);
                }
                Op::Trim { offset, length } => {
                    unspecified[offset as usize..(offset + length as u64) as usize].fill(true);
                }
                Op::Flush => {}
            }
        }
        client.send(CMD_DISC, 0, 0, 0, 0, &[]);
    };
    if engines == 1 {
        with_server(MemoryStore::new(PAGE, PAGES), client_side);
    } else {
        let pages = ShardLayout::new(engines, PAGES).engine_pages();
        let stores = (0..engines).map(|_| MemoryStore::new(PAGE, pages)).collect();
        let stores = with_shared(Shards::new(stores, PAGES), client_side).into_inner();
        assert!(stores.iter().all(|store| store.pages.len() as u64 <= pages));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn pipelined_requests_match_the_model(
        ops in proptest::collection::vec(op(), 1..40),
        structured: bool,
        engines in 1usize..=3,
    ) {
        run_against_model(&ops, structured, engines);
    }

    /// Arbitrary bytes after a valid handshake: the connection ends (error or disconnect)
    /// without a panic or a hang.
    #[test]
    fn arbitrary_request_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), structured: bool) {
        with_server(MemoryStore::new(PAGE, PAGES), |socket| {
            let mut client = TestClient::connect(socket, structured);
            let _ = client.socket.write_all(&bytes);
            let _ = client.socket.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = client.socket.read_to_end(&mut sink);
        });
    }

    /// Well-framed requests with arbitrary fields: each gets a reply or ends the connection.
    #[test]
    fn arbitrary_request_fields_never_panic(
        requests in proptest::collection::vec((any::<u16>(), 0u16..9, any::<u64>(), any::<u32>()), 1..12),
        structured: bool,
    ) {
        with_server(MemoryStore::new(PAGE, PAGES), |socket| {
            let mut client = TestClient::connect(socket, structured);
            for (index, (flags, command, offset, length)) in requests.iter().enumerate() {
                // A write's announced payload is not sent: the server must wait or refuse,
                // never read out of bounds.
                if *command == CMD_WRITE { continue; }
                client.send(*command, *flags, index as u64, *offset, *length, &[]);
            }
            let _ = client.socket.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = client.socket.read_to_end(&mut sink);
        });
    }
}

#[test]
fn unaligned_write_is_read_modify_write() {
    run_against_model(
        &[
            Op::Write { offset: 0, length: 3 * PAGE as u32, seed: 1 },
            Op::Flush,
            Op::Write { offset: 100, length: 10, seed: 2 },
            Op::Write { offset: PAGE as u64 - 5, length: 10, seed: 3 },
            Op::Read { offset: 0, length: 3 * PAGE as u32 },
            Op::Write { offset: 4000, length: 200, seed: 4 },
            Op::Write { offset: 4050, length: 10, seed: 5 },
            Op::Read { offset: 3990, length: 300 },
        ],
        true,
        1,
    );
}

/// Pages 30-34 straddle the first chunk boundary: one request, parts on two engines, partial
/// pages at both ends read, patched and written on their own engines.
#[test]
fn a_request_across_a_chunk_boundary_runs_on_both_engines() {
    let chunk = crate::shards::CHUNK_PAGES * PAGE as u64;
    run_against_model(
        &[
            Op::Write { offset: chunk - 2 * PAGE as u64 - 7, length: 4 * PAGE as u32 + 20, seed: 6 },
            Op::Read { offset: chunk - 3 * PAGE as u64, length: 6 * PAGE as u32 },
            Op::Zero { offset: chunk - 100, length: 300 },
            Op::Trim { offset: chunk + PAGE as u64, length: PAGE as u32 },
            Op::Read { offset: chunk - PAGE as u64, length: 3 * PAGE as u32 },
        ],
        true,
        2,
    );
}

#[test]
fn write_zeroes_zeroes_partial_and_whole_pages() {
    run_against_model(
        &[
            Op::Write { offset: 0, length: 4 * PAGE as u32, seed: 9 },
            Op::Zero { offset: 1000, length: 2 * PAGE as u32 },
            Op::Read { offset: 0, length: 4 * PAGE as u32 },
        ],
        false,
        1,
    );
}

#[test]
fn pipelined_pages_share_one_execute() {
    let store = with_server(MemoryStore::new(PAGE, PAGES), |socket| {
        let mut client = TestClient::connect(socket, false);
        let mut batch = Vec::new();
        for handle in 0..32u64 {
            let header = RequestHeader {
                flags: 0,
                command: CMD_WRITE,
                handle,
                offset: handle * PAGE as u64,
                length: PAGE as u32,
            };
            encode_request(&header, &mut batch);
            batch.extend_from_slice(&[handle as u8; PAGE]);
        }
        client.socket.write_all(&batch).unwrap();
        let lengths = std::collections::HashMap::new();
        for _ in 0..32 {
            assert_eq!(client.receive(&lengths).error, 0);
        }
        client.send(CMD_DISC, 0, 0, 0, 0, &[]);
    });
    assert_eq!(store.ops_executed, 32);
    assert!(store.batches_executed < 32, "{} batches for 32 pipelined writes", store.batches_executed);
}

#[test]
fn lost_pages_fail_with_eio_and_the_connection_lives_on() {
    let mut store = MemoryStore::new(PAGE, PAGES);
    store.lost.insert(3);
    with_server(store, |socket| {
        let mut client = TestClient::connect(socket, true);
        let mut lengths = std::collections::HashMap::new();
        lengths.insert(1, 2 * PAGE as u32);
        client.send(CMD_READ, 0, 1, 2 * PAGE as u64, 2 * PAGE as u32, &[]);
        assert_eq!(client.receive(&lengths).error, ErrorCode::Io.value());
        client.send(CMD_WRITE, 0, 2, 3 * PAGE as u64 + 1, 1, &[7]);
        assert_eq!(client.receive(&lengths).error, ErrorCode::Io.value());
        lengths.insert(3, 10);
        client.send(CMD_READ, 0, 3, 0, 10, &[]);
        let reply = client.receive(&lengths);
        assert_eq!((reply.error, reply.data), (0, vec![0; 10]));
        client.send(CMD_DISC, 0, 0, 0, 0, &[]);
    });
}

#[test]
fn bad_requests_get_spec_errors() {
    with_server(MemoryStore::new(PAGE, PAGES), |socket| {
        let mut client = TestClient::connect(socket, false);
        let lengths = std::collections::HashMap::new();
        client.send(CMD_READ, 0, 1, SIZE, 1, &[]);
        assert_eq!(client.receive(&lengths).error, ErrorCode::Invalid.value());
        client.send(CMD_WRITE, 0, 2, SIZE - 1, 2, &[1, 2]);
        assert_eq!(client.receive(&lengths).error, ErrorCode::NoSpace.value());
        client.send(CMD_READ, 0, 3, 0, 2 << 20, &[]);
        assert_eq!(client.receive(&lengths).error, ErrorCode::Invalid.value());
        client.send(99, 0, 4, 0, 0, &[]);
        assert_eq!(client.receive(&lengths).error, ErrorCode::Invalid.value());
        client.send(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 5, 1, 1, &[]);
        assert_eq!(client.receive(&lengths).error, ErrorCode::NotSupported.value());
        // A write larger than the maximum block size is a hard disconnect.
        client.send(CMD_WRITE, 0, 6, 0, u32::MAX, &[]);
        let mut sink = Vec::new();
        client.socket.read_to_end(&mut sink).unwrap();
        assert!(sink.is_empty());
    });
}
