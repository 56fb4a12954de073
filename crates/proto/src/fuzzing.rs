//! The bodies of the `decode_frame` and `open_messages` fuzz targets (`fuzz/`), kept here so
//! that stable-toolchain property tests run exactly the same code; and [`Xorshift`], the
//! deterministic inputs of the stable stand-ins of every fuzz target (remem-nbd's and
//! remem-memcache's tests too).
//!
//! Oracle of `decode_frame`: no panic on any input, and every frame that decodes re-encodes to
//! the same bytes (the decoders are strict, so the encoding is canonical). `open_messages` has
//! its own (its doc).

use crate::sizes::{HEADER_BYTES, READ_SPLITS_COUNT_BYTES, SPLIT_META_BYTES, WRITE_SPLIT_PREFIX_BYTES};
use crate::{decode_read_splits_count, Control, FrameHeader, Kind, SplitMeta, WriteSplitPrefix};

/// Decodes `data` as a stream of frames until the first error or the end; returns how many whole
/// frames decoded. Panics only if a decoded frame does not re-encode to its own bytes.
pub fn decode_stream(mut data: &[u8]) -> usize {
    let mut frames = 0;
    let mut encoded = Vec::new();
    loop {
        let Some((header_bytes, rest)) = data.split_first_chunk::<HEADER_BYTES>() else {
            return frames;
        };
        let Ok(header) = FrameHeader::decode(header_bytes) else {
            return frames;
        };
        assert_eq!(&header.encode(), header_bytes, "header re-encodes differently");
        let Some((body, rest)) = rest.split_at_checked(header.body_len as usize) else {
            return frames;
        };
        if !decode_body(header, body, &mut encoded) {
            return frames;
        }
        frames += 1;
        data = rest;
    }
}

fn decode_body(header: FrameHeader, body: &[u8], encoded: &mut Vec<u8>) -> bool {
    match header.kind {
        Kind::WriteSplit => {
            let prefix: &[u8; WRITE_SPLIT_PREFIX_BYTES] = body[..WRITE_SPLIT_PREFIX_BYTES]
                .try_into()
                .expect("header admits only bodies of at least the prefix");
            match WriteSplitPrefix::decode(prefix) {
                Ok(decoded) => {
                    assert_eq!(&decoded.encode(), prefix);
                    true
                }
                Err(_) => false,
            }
        }
        Kind::ReadSplitReply => {
            let meta: &[u8; SPLIT_META_BYTES] =
                body[..SPLIT_META_BYTES].try_into().expect("header admits only bodies of at least the meta");
            match SplitMeta::decode(meta) {
                Ok(decoded) => {
                    assert_eq!(&decoded.encode(), meta);
                    true
                }
                Err(_) => false,
            }
        }
        Kind::ReadSplitsReply => {
            let count_bytes: &[u8; READ_SPLITS_COUNT_BYTES] = body[..READ_SPLITS_COUNT_BYTES]
                .try_into()
                .expect("header admits only bodies of at least the count");
            let Ok(count) = decode_read_splits_count(count_bytes) else {
                return false;
            };
            // Entries are equal-sized: the body after the count must split evenly into `count`.
            let entries = &body[READ_SPLITS_COUNT_BYTES..];
            if !entries.len().is_multiple_of(count as usize)
                || entries.len() / (count as usize) < SPLIT_META_BYTES
            {
                return false;
            }
            let entry_bytes = entries.len() / count as usize;
            entries.chunks_exact(entry_bytes).all(|entry| {
                let meta: &[u8; SPLIT_META_BYTES] =
                    entry[..SPLIT_META_BYTES].try_into().expect("entry is at least the meta");
                SplitMeta::decode(meta).is_ok()
            })
        }
        kind => match Control::decode_body(kind, body) {
            Ok(control) => {
                encoded.clear();
                control.encode(header.request_id, encoded);
                assert_eq!(&encoded[..HEADER_BYTES], &header.encode());
                assert_eq!(&encoded[HEADER_BYTES..], body, "{kind:?} re-encodes differently");
                true
            }
            Err(_) => false,
        },
    }
}

/// A deterministic source of test inputs for the stable stand-ins of the fuzz targets (here and
/// in remem-nbd and remem-memcache): xorshift64*, small and fast, quality enough to pick inputs;
/// a seed gives the same inputs on every run.
pub struct Xorshift(u64);

impl Xorshift {
    /// A generator from `seed` (0 is taken as 1: xorshift never leaves 0).
    pub fn new(seed: u64) -> Xorshift {
        Xorshift(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }

    /// One of `choices`, which must not be empty.
    pub fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[self.below(choices.len() as u64) as usize]
    }

    /// Flips, overwrites, cuts, inserts or repeats a few bytes of `data`, as a fuzzer's
    /// mutations do; `specials` are the bytes worth writing (a protocol's separators).
    pub fn mutate(&mut self, data: &mut Vec<u8>, specials: &[u8]) {
        for _ in 0..self.below(4) + 1 {
            if data.is_empty() {
                return;
            }
            let at = self.below(data.len() as u64) as usize;
            match self.below(5) {
                0 => data[at] ^= 1 << self.below(8),
                1 if !specials.is_empty() => data[at] = self.pick(specials),
                1 | 2 => data.truncate(at),
                3 => data.insert(at, self.next_u64() as u8),
                _ => {
                    let piece: Vec<u8> = data[at..].iter().take(32).copied().collect();
                    data.splice(at..at, piece);
                }
            }
        }
    }
}

/// The body of the `open_messages` fuzz target (`fuzz/`): the receiving side of an encrypted
/// connection (`encryption`) fed `data` three ways. As the node's view of a connection's
/// opening; as raw ciphertext after a real handshake; and as plaintext sealed into messages,
/// one byte of them altered when `data`'s length is odd, handed to an [`Inbound`] in pieces and
/// taken out into buffers of sizes `data` chooses. Returns the plaintext bytes handed out.
///
/// Oracle: no panic; garbage never authenticates; what is handed out is always a prefix of what
/// was sealed: all of it, with no error, when nothing was altered, and never the altered message
/// (an error comes first).
pub fn open_messages(data: &[u8]) -> usize {
    use crate::auth::Secret;
    use crate::encryption::{respond, Inbound, Initiator, LENGTH_BYTES, OPENING_BYTES};
    let secret = Secret::from_bytes(vec![7; 32]).expect("32 bytes");
    if let Some(opening) = data.first_chunk::<OPENING_BYTES>() {
        let _ = respond(&secret, opening, &mut Vec::new());
    }
    let pair = || {
        let mut opening = Vec::new();
        let initiator = Initiator::start(&secret, &mut opening);
        let mut reply = Vec::new();
        let opening: &[u8; OPENING_BYTES] = opening[..].try_into().expect("an opening of its size");
        let (_, opener) = respond(&secret, opening, &mut reply).expect("our own opening");
        let (sealer, _) = initiator.finish(&reply[LENGTH_BYTES..]).expect("our own reply");
        (sealer, Inbound::new(opener))
    };
    let (_, mut garbage) = pair();
    let mut out = [0u8; 256];
    let mut fed = 0;
    while fed < data.len() {
        let spare = garbage.spare();
        let count = spare.len().min(data.len() - fed);
        spare[..count].copy_from_slice(&data[fed..fed + count]);
        garbage.received(count);
        fed += count;
        match garbage.take_plaintext(&mut out) {
            Ok(taken) => assert_eq!(taken, 0, "bytes nobody sealed authenticated"),
            Err(_) => break,
        }
    }
    let (mut sealer, mut inbound) = pair();
    let mut sealed = Vec::new();
    for piece in data.chunks(1 + data.first().copied().unwrap_or(0) as usize * 300) {
        sealer.seal(piece, &mut sealed).expect("nonces left");
    }
    let altered = data.len() % 2 == 1 && !sealed.is_empty();
    if altered {
        let at = data.len().wrapping_mul(7919) % sealed.len();
        sealed[at] ^= 1 << (data.len() % 8);
    }
    let (mut handed, mut fed, mut step) = (Vec::new(), 0, 0);
    let mut failed = false;
    let mut out = vec![0u8; 70_000];
    while fed < sealed.len() && !failed {
        let size =
            |salt: usize| 1 + data.get((step + salt) % data.len().max(1)).copied().unwrap_or(0) as usize * 97;
        let spare = inbound.spare();
        let count = spare.len().min(sealed.len() - fed).min(size(0) * 13);
        spare[..count].copy_from_slice(&sealed[fed..fed + count]);
        inbound.received(count);
        fed += count;
        loop {
            let room = size(1).min(out.len());
            match inbound.take_plaintext(&mut out[..room]) {
                Ok(0) => break,
                Ok(taken) => handed.extend_from_slice(&out[..taken]),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        step += 1;
    }
    assert!(data.starts_with(&handed), "plaintext handed out that was never sealed");
    if altered {
        assert!(failed || handed.len() < data.len(), "an altered message was handed out");
    } else {
        assert!(!failed && handed.len() == data.len(), "an unaltered stream did not come through whole");
    }
    handed.len()
}
