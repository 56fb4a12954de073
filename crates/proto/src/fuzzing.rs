//! The body of the `decode_frame` fuzz target (`fuzz/`), kept here so that stable-toolchain
//! property tests run exactly the same code; and [`Xorshift`], the deterministic inputs of the
//! stable stand-ins of every fuzz target (remem-nbd's and remem-memcache's tests too).
//!
//! Oracle: no panic on any input, and every frame that decodes re-encodes to the same bytes
//! (the decoders are strict, so the encoding is canonical).

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
