//! One item's essential state as bytes: what a restarted (or standby) `remem kv` needs to serve
//! the item again without the process that stored it.
//!
//! Payload, little-endian: `seq: u64 | cas: u64 | expires_at: u64 | flags: u32 |
//! value_bytes: u32 | value_crc: u32 | scheme: u8 | pinned: u8 | key_len: u8 | has_tail: u8 |
//! tail_page: u64 | tail_class: u8 | tail_slot: u8 | run_count: u32 | runs: (first: u64,
//! len: u32) * run_count | key`. The whole pages of the value are listed as runs of consecutive
//! pages, in the value's order.
//!
//! Decoding is total: any byte string decodes to a record or an error, and nothing is
//! allocated from a count before the count is checked against the bytes present. What only the
//! cache can check (pages inside the scheme's region, no two items on one page) is checked
//! when the records are restored (`crate::restore`).

use crate::scheme::Scheme;
use crate::space::{class_sizes, Chunk, Extent, CHUNK_MAX_BYTES, PAGE_BYTES};

/// Bytes before the runs.
pub const FIXED_BYTES: usize = 8 + 8 + 8 + 4 + 4 + 4 + 1 + 1 + 1 + 1 + 8 + 1 + 1 + 4;
const RUN_BYTES: usize = 12;
/// memcached's key limit.
pub const MAX_KEY_BYTES: usize = 250;

/// An item as the backup holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemRecord {
    /// Write order: of two records of one key, the higher is the newer.
    pub seq: u64,
    pub cas: u64,
    pub expires_at: u64,
    pub flags: u32,
    pub value_bytes: usize,
    /// CRC32C of the value: checked on the first read after a restore.
    pub value_crc: u32,
    pub scheme: Scheme,
    pub pinned: bool,
    pub extent: Extent,
    pub key: Box<[u8]>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record of {0} bytes is shorter than its fixed part")]
    Short(usize),
    #[error("key of {0} bytes (1 to 250 allowed)")]
    KeyLength(usize),
    #[error("record length {actual} does not match its {runs} runs and {key} key bytes")]
    Length { actual: usize, runs: u64, key: usize },
    #[error("unknown scheme byte {0}")]
    Scheme(u8),
    #[error("bad chunk: class {class}, slot {slot}")]
    Chunk { class: u8, slot: u8 },
    #[error("run of {len} pages at {first} is empty or overflows")]
    Run { first: u64, len: u32 },
    #[error("{pages} pages and {chunk} do not hold a value of {value_bytes} bytes")]
    Shape { pages: u64, chunk: &'static str, value_bytes: usize },
    #[error("flag byte {0} is not 0 or 1")]
    Flag(u8),
}

const SCHEMES: [Scheme; 5] = [Scheme::None, Scheme::Rep2, Scheme::Rep3, Scheme::Ec, Scheme::Eor];

fn scheme_byte(scheme: Scheme) -> u8 {
    SCHEMES.iter().position(|&known| known == scheme).expect("every scheme is listed") as u8
}

/// Runs of consecutive pages.
fn runs(pages: &[u64]) -> impl Iterator<Item = (u64, u32)> + '_ {
    let mut index = 0;
    std::iter::from_fn(move || {
        let first = *pages.get(index)?;
        let mut len = 1u32;
        while pages.get(index + len as usize) == Some(&(first + u64::from(len))) && len < u32::MAX {
            len += 1;
        }
        index += len as usize;
        Some((first, len))
    })
}

/// A record to write, borrowing the item's key and place (no allocation per store).
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    pub seq: u64,
    pub cas: u64,
    pub expires_at: u64,
    pub flags: u32,
    pub value_bytes: usize,
    pub value_crc: u32,
    pub scheme: Scheme,
    pub pinned: bool,
    pub extent: &'a Extent,
    pub key: &'a [u8],
}

impl ItemRecord {
    pub fn view(&self) -> RecordView<'_> {
        RecordView {
            seq: self.seq,
            cas: self.cas,
            expires_at: self.expires_at,
            flags: self.flags,
            value_bytes: self.value_bytes,
            value_crc: self.value_crc,
            scheme: self.scheme,
            pinned: self.pinned,
            extent: &self.extent,
            key: &self.key,
        }
    }
}

impl RecordView<'_> {
    /// Payload bytes of this record.
    pub fn encoded_len(&self) -> usize {
        FIXED_BYTES + runs(&self.extent.pages).count() * RUN_BYTES + self.key.len()
    }

    /// Writes the payload into `out`, which is exactly [`RecordView::encoded_len`] bytes.
    pub fn encode_into(&self, out: &mut [u8]) {
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(&self.seq.to_le_bytes());
        put(&self.cas.to_le_bytes());
        put(&self.expires_at.to_le_bytes());
        put(&self.flags.to_le_bytes());
        put(&(self.value_bytes as u32).to_le_bytes());
        put(&self.value_crc.to_le_bytes());
        let tail = self.extent.tail.unwrap_or(Chunk { page: 0, class: 0, slot: 0 });
        put(&[
            scheme_byte(self.scheme),
            self.pinned as u8,
            self.key.len() as u8,
            self.extent.tail.is_some() as u8,
        ]);
        put(&tail.page.to_le_bytes());
        put(&[tail.class, tail.slot]);
        put(&(runs(&self.extent.pages).count() as u32).to_le_bytes());
        for (first, len) in runs(&self.extent.pages) {
            put(&first.to_le_bytes());
            put(&len.to_le_bytes());
        }
        put(self.key);
        debug_assert_eq!(at, out.len());
    }
}

impl ItemRecord {
    /// Decodes and checks a payload (see the module docs).
    pub fn decode(bytes: &[u8]) -> Result<ItemRecord, RecordError> {
        if bytes.len() < FIXED_BYTES {
            return Err(RecordError::Short(bytes.len()));
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let (seq, cas, expires_at) = (u64_at(0), u64_at(8), u64_at(16));
        let (flags, value_bytes, value_crc) = (u32_at(24), u32_at(28) as usize, u32_at(32));
        let scheme = *SCHEMES.get(bytes[36] as usize).ok_or(RecordError::Scheme(bytes[36]))?;
        let pinned = match bytes[37] {
            flag @ 0..=1 => flag == 1,
            other => return Err(RecordError::Flag(other)),
        };
        let key_len = bytes[38] as usize;
        if key_len == 0 || key_len > MAX_KEY_BYTES {
            return Err(RecordError::KeyLength(key_len));
        }
        let has_tail = match bytes[39] {
            flag @ 0..=1 => flag == 1,
            other => return Err(RecordError::Flag(other)),
        };
        let (tail_page, tail_class, tail_slot) = (u64_at(40), bytes[48], bytes[49]);
        let run_count = u64::from(u32_at(50));
        let expected = FIXED_BYTES as u64 + run_count * RUN_BYTES as u64 + key_len as u64;
        if expected != bytes.len() as u64 {
            return Err(RecordError::Length { actual: bytes.len(), runs: run_count, key: key_len });
        }
        let tail = if has_tail {
            let class_ok = (tail_class as usize) < class_sizes().len();
            let slots = if class_ok { (PAGE_BYTES / class_sizes()[tail_class as usize]).min(64) } else { 0 };
            if !class_ok || tail_slot as usize >= slots {
                return Err(RecordError::Chunk { class: tail_class, slot: tail_slot });
            }
            Some(Chunk { page: tail_page, class: tail_class, slot: tail_slot })
        } else {
            None
        };
        // Whole pages the value needs, and whether its rest is a chunk (the allocator's rule).
        let whole = (value_bytes / PAGE_BYTES) as u64;
        let rest = value_bytes % PAGE_BYTES;
        let (pages_needed, chunk_needed) = match rest {
            0 => (whole, false),
            rest if rest > CHUNK_MAX_BYTES => (whole + 1, false),
            _ => (whole, true),
        };
        let mut listed = 0u64;
        for index in 0..run_count as usize {
            let at = FIXED_BYTES + index * RUN_BYTES;
            let (first, len) = (u64_at(at), u32_at(at + 8));
            if len == 0 || first.checked_add(u64::from(len)).is_none() {
                return Err(RecordError::Run { first, len });
            }
            listed = listed.saturating_add(u64::from(len));
        }
        let chunk_fits = tail.is_some_and(|chunk| class_sizes()[chunk.class as usize] >= rest);
        if listed != pages_needed || chunk_needed != tail.is_some() || (chunk_needed && !chunk_fits) {
            let chunk = if tail.is_some() { "a chunk" } else { "no chunk" };
            return Err(RecordError::Shape { pages: listed, chunk, value_bytes });
        }
        // `listed` equals the value's page count, which is bounded by its u32 size.
        let mut pages = Vec::with_capacity(listed as usize);
        for index in 0..run_count as usize {
            let at = FIXED_BYTES + index * RUN_BYTES;
            let (first, len) = (u64_at(at), u32_at(at + 8));
            pages.extend((0..u64::from(len)).map(|offset| first + offset));
        }
        let key_at = FIXED_BYTES + run_count as usize * RUN_BYTES;
        Ok(ItemRecord {
            seq,
            cas,
            expires_at,
            flags,
            value_bytes,
            value_crc,
            scheme,
            pinned,
            extent: Extent { pages, tail },
            key: bytes[key_at..].into(),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> ItemRecord {
        ItemRecord {
            seq: 7,
            cas: 99,
            expires_at: 1_900_000_000,
            flags: 0xdead_beef,
            value_bytes: 3 * PAGE_BYTES + 100,
            value_crc: 0x1234_5678,
            scheme: Scheme::Eor,
            pinned: true,
            extent: Extent {
                pages: vec![10, 11, 40],
                tail: Some(Chunk { page: 77, class: class_of(100), slot: 5 }),
            },
            key: (*b"user:42").into(),
        }
    }

    /// The smallest chunk class holding `bytes`.
    pub(crate) fn class_of(bytes: usize) -> u8 {
        class_sizes().iter().position(|&size| size >= bytes).expect("a class") as u8
    }

    fn encode(record: &ItemRecord) -> Vec<u8> {
        let mut bytes = vec![0; record.view().encoded_len()];
        record.view().encode_into(&mut bytes);
        bytes
    }

    #[test]
    fn a_record_round_trips_with_its_pages_as_runs() {
        let record = sample();
        let bytes = encode(&record);
        assert_eq!(bytes.len(), FIXED_BYTES + 2 * RUN_BYTES + 7, "pages 10, 11 are one run, 40 another");
        assert_eq!(ItemRecord::decode(&bytes).unwrap(), record);
    }

    #[test]
    fn records_that_do_not_describe_a_value_are_refused() {
        let mut record = sample();
        record.value_bytes = 5 * PAGE_BYTES;
        assert!(matches!(ItemRecord::decode(&encode(&record)), Err(RecordError::Shape { .. })));
        let mut bytes = encode(&sample());
        bytes[38] = 0;
        assert_eq!(ItemRecord::decode(&bytes), Err(RecordError::KeyLength(0)));
        let mut bytes = encode(&sample());
        bytes[36] = 9;
        assert_eq!(ItemRecord::decode(&bytes), Err(RecordError::Scheme(9)));
        let mut bytes = encode(&sample());
        bytes[50..54].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(ItemRecord::decode(&bytes), Err(RecordError::Length { .. })));
        let mut bytes = encode(&sample());
        bytes[49] = 200;
        assert!(matches!(ItemRecord::decode(&bytes), Err(RecordError::Chunk { .. })));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_to_a_record_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(record) = ItemRecord::decode(&bytes) {
                prop_assert_eq!(ItemRecord::decode(&encode(&record)), Ok(record));
            }
        }

        #[test]
        fn damaged_records_never_panic(flip in 0usize..4096, bit in 0u8..8) {
            let mut bytes = encode(&sample());
            let at = flip % bytes.len();
            bytes[at] ^= 1 << bit;
            let _ = ItemRecord::decode(&bytes);
        }
    }
}
