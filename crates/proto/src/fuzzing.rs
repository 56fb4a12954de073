//! The body of the `decode_frame` fuzz target (`fuzz/`), kept here so that stable-toolchain
//! property tests run exactly the same code.
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
