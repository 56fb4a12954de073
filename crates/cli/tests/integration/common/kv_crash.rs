//! What the crash tests of `remem kv` share (a restart after SIGKILL, a standby taking over):
//! a writer that sets and deletes keys of every size until its server dies, and knows what was
//! acknowledged; a check of every key against that; damage done to a backup region by hand.

// Included by several test crates (`#[path = "common/kv_crash.rs"]`), each using part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use remem::kv_bench::{value_for, ClientError, ServerProcess, StoreOutcome, TextClient};

pub const KEYS: u64 = 400;

/// What the writer knows: each key's last acknowledged state (a value's generation, or deleted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    Value(u64),
    Deleted,
}

pub fn key(index: u64) -> String {
    format!("key:{index}")
}

/// Sizes that take a chunk, a page, pages and a chunk, and many pages (EOR by default).
pub fn length_of(generation: u64) -> usize {
    [17, 700, 2049, 4096, 9000, 40_000][(generation % 6) as usize]
}

pub fn expected_value(index: u64, generation: u64) -> Vec<u8> {
    value_for(index, generation, length_of(generation))
}

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Writes until the server dies: returns what was acknowledged, and the operation in flight.
pub fn write_until_killed(
    address: std::net::SocketAddr,
    known: HashMap<u64, Known>,
    seed: u64,
    generation_base: u64,
) -> (HashMap<u64, Known>, Option<(u64, Known)>, u64) {
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    write_until_killed_counting(address, known, seed, generation_base, progress)
}

/// Waits until `progress` reaches `count` acknowledged writes (at most 30 s), so that a kill
/// that follows lands mid-run on a loaded machine too, not before the writer got going.
pub fn wait_for_writes(progress: &std::sync::atomic::AtomicU64, count: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while progress.load(std::sync::atomic::Ordering::Relaxed) < count {
        assert!(std::time::Instant::now() < deadline, "the writer made no progress in 30 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// [`write_until_killed`], counting acknowledged writes in `progress` as it goes.
pub fn write_until_killed_counting(
    address: std::net::SocketAddr,
    mut known: HashMap<u64, Known>,
    seed: u64,
    generation_base: u64,
    progress: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> (HashMap<u64, Known>, Option<(u64, Known)>, u64) {
    let mut client = TextClient::connect(address, Duration::from_secs(10)).expect("connects");
    let mut rng = Rng(seed | 1);
    let mut generation = generation_base;
    let mut acknowledged = 0;
    loop {
        let index = rng.next() % KEYS;
        let op = if rng.next().is_multiple_of(10) { Known::Deleted } else { Known::Value(generation) };
        let result = match op {
            Known::Value(generation) => client
                .set(&key(index), &expected_value(index, generation))
                .map(|outcome| assert_eq!(outcome, StoreOutcome::Stored)),
            Known::Deleted => client.delete(&key(index)).map(drop),
        };
        match result {
            Ok(()) => {
                known.insert(index, op);
                acknowledged += 1;
                progress.store(acknowledged, std::sync::atomic::Ordering::Relaxed);
            }
            Err(ClientError::Io(_)) => return (known, Some((index, op)), acknowledged),
            Err(error) => {
                panic!("{} of {}: {error}", if op == Known::Deleted { "delete" } else { "set" }, key(index))
            }
        }
        generation += 1;
    }
}

/// Sets and deletes `count` keys (as [`write_until_killed`] does), each acknowledged, and
/// records them in `known`; `generation` goes on from where it is.
pub fn write_ops(
    address: std::net::SocketAddr,
    known: &mut HashMap<u64, Known>,
    rng: &mut Rng,
    generation: &mut u64,
    count: u64,
) {
    let mut client = TextClient::connect(address, Duration::from_secs(10)).expect("connects");
    for _ in 0..count {
        let index = rng.next() % KEYS;
        if rng.next().is_multiple_of(10) {
            client.delete(&key(index)).unwrap_or_else(|error| panic!("delete {}: {error}", key(index)));
            known.insert(index, Known::Deleted);
        } else {
            let outcome = client
                .set(&key(index), &expected_value(index, *generation))
                .unwrap_or_else(|error| panic!("set {}: {error}", key(index)));
            assert_eq!(outcome, StoreOutcome::Stored, "set {}", key(index));
            known.insert(index, Known::Value(*generation));
        }
        *generation += 1;
    }
}

/// Checks every key against what was acknowledged; returns (present, missing, refused).
pub fn verify(
    client: &mut TextClient,
    known: &HashMap<u64, Known>,
    in_flight: Option<(u64, Known)>,
    strict: bool,
) -> (u64, u64, u64) {
    let (mut present, mut missing, mut refused) = (0, 0, 0);
    for index in 0..KEYS {
        let got = match client.get(&key(index)) {
            Ok(got) => got,
            Err(ClientError::Server(line)) if !strict => {
                assert!(line.contains("lost the value"), "{line}");
                refused += 1;
                // The rest of that get's reply (END) is still on the connection: a new one.
                *client =
                    TextClient::connect(client.stream().peer_addr().expect("peer"), Duration::from_secs(10))
                        .expect("reconnects");
                continue;
            }
            Err(error) => panic!("get {}: {error}", key(index)),
        };
        let mut allowed: Vec<Option<Vec<u8>>> = Vec::new();
        let expected_of = |state: Option<Known>| match state {
            Some(Known::Value(generation)) => Some(expected_value(index, generation)),
            Some(Known::Deleted) | None => None,
        };
        allowed.push(expected_of(known.get(&index).copied()));
        if let Some((in_flight_index, op)) = in_flight {
            if in_flight_index == index {
                allowed.push(expected_of(Some(op)));
            }
        }
        if !strict {
            // A damaged region may drop any item, never serve another value.
            allowed.push(None);
        }
        assert!(
            allowed.contains(&got),
            "{}: got {:?} bytes, acknowledged {:?}, in flight {:?}",
            key(index),
            got.as_ref().map(Vec::len),
            known.get(&index),
            in_flight
        );
        match got {
            Some(_) => present += 1,
            None => missing += 1,
        }
    }
    (present, missing, refused)
}

pub fn sigkill(server: &mut ServerProcess) {
    // SAFETY: kill with the PID of a child the test spawned and has not reaped.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.exited().is_none() {
        assert!(Instant::now() < deadline, "remem kv did not die");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Flips one payload bit in `count` live records and swaps the keys of two records whose keys
/// have the same length, recomputing their checksums. Returns the forged keys.
pub fn damage(path: &Path, count: usize) -> Vec<String> {
    let mut bytes = std::fs::read(path).expect("backup region");
    let chunk_count = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let header = (20 + chunk_count).next_multiple_of(4096);
    let mut live = Vec::new();
    for chunk in 0..chunk_count {
        let class = bytes[20 + chunk];
        if class == 0 {
            break;
        }
        let size = 128usize << (class - 1);
        let start = header + chunk * (1 << 20);
        for slot in (start..start + (1 << 20)).step_by(size) {
            if &bytes[slot..slot + 4] == b"REK1" {
                live.push(slot);
            }
        }
    }
    assert!(live.len() > count + 2, "{} live records", live.len());
    let payload = |bytes: &[u8], slot: usize| {
        let len = u32::from_le_bytes(bytes[slot + 4..slot + 8].try_into().unwrap()) as usize;
        (slot + 12, len)
    };
    let key_of = |bytes: &[u8], slot: usize| {
        let (at, len) = payload(bytes, slot);
        let key_len = bytes[at + 38] as usize;
        (at + len - key_len, key_len)
    };
    // Forge first (two records, same key length), then damage others.
    let mut forged = Vec::new();
    'pairs: for (position, &a) in live.iter().enumerate() {
        for &b in &live[position + 1..] {
            let ((key_a, len_a), (key_b, len_b)) = (key_of(&bytes, a), key_of(&bytes, b));
            if len_a == len_b && bytes[key_a..key_a + len_a] != bytes[key_b..key_b + len_b] {
                let copy_a = bytes[key_a..key_a + len_a].to_vec();
                let copy_b = bytes[key_b..key_b + len_b].to_vec();
                bytes[key_a..key_a + len_a].copy_from_slice(&copy_b);
                bytes[key_b..key_b + len_b].copy_from_slice(&copy_a);
                for slot in [a, b] {
                    let (at, len) = payload(&bytes, slot);
                    let crc = crc32c::crc32c_append(
                        crc32c::crc32c(&(len as u32).to_le_bytes()),
                        &bytes[at..at + len],
                    );
                    bytes[slot + 8..slot + 12].copy_from_slice(&crc.to_le_bytes());
                }
                forged = vec![
                    String::from_utf8_lossy(&copy_a).into_owned(),
                    String::from_utf8_lossy(&copy_b).into_owned(),
                ];
                live.retain(|&slot| slot != a && slot != b);
                break 'pairs;
            }
        }
    }
    for (number, &slot) in live.iter().take(count).enumerate() {
        let (at, len) = payload(&bytes, slot);
        bytes[at + (number * 7) % len] ^= 1 << (number % 8);
    }
    // In place, never truncated: another process may have the region mapped.
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path).expect("open the region");
    file.write_all_at(&bytes, 0).expect("write the damaged region");
    forged
}

/// Takes what the write in flight at the kill left (now settled, served by the new server) as
/// acknowledged state.
pub fn settle(client: &mut TextClient, known: &mut HashMap<u64, Known>, in_flight: Option<(u64, Known)>) {
    let Some((index, op)) = in_flight else { return };
    let got = client.get(&key(index)).expect("get");
    let state = match got {
        None => Known::Deleted,
        Some(bytes) => *[known.get(&index).copied(), Some(op)]
            .iter()
            .flatten()
            .find(|state| matches!(state, Known::Value(g) if expected_value(index, *g) == bytes))
            .expect("verified before"),
    };
    known.insert(index, state);
}
