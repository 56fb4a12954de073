//! The fast coder: ISA-L's SIMD kernels over the splits of the caller's page, in place.
//!
//! Invariants:
//! - no allocation on the hot path: encode tables are built in [`IsalCodec::new`]; decode tables
//!   are built on the first decode with a given set of source splits and cached in the coder
//!   (at most C(k + r, k) entries, 4,845 for (16, 4); 45 for (8, 2)), and the pointer arrays
//!   ISA-L wants live on the stack;
//! - tables are never persisted or shared between processes: since ISA-L 2.31 their format depends
//!   on the CPU's instruction set;
//! - bytes are identical to [`crate::ReferenceCodec`]'s (same generator matrix, same choice of
//!   source splits), which the tests check.
//!
//! This file is also compiled into `crates/isal-baseline` against Debian's libisal through that
//! crate's own `isal_ffi` module, so the baseline and this coder differ only in the library.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::isal_ffi;
use crate::matrix::{generator_matrix, source_rows};
use crate::page_codec::{assert_encode_buffers, plan_decode, set_bits, DecodeError, DecodePlan, PageCodec};
use crate::params::{CodecParams, MAX_DATA_SPLITS, MAX_PARITY_SPLITS};

/// Reed-Solomon page coder over ISA-L. See the module docs for its invariants.
pub struct IsalCodec {
    params: CodecParams,
    /// ISA-L tables of the r parity rows of the generator matrix; empty when r = 0.
    encode_tables: Vec<u8>,
    /// Decode tables keyed by the mask of the k source splits (which also fixes the missing data
    /// splits: they are the data splits outside the mask).
    decode_cache: HashMap<u32, DecodeTables, BuildHasherDefault<MaskHasher>>,
}

/// Everything one erasure pattern needs, computed once.
struct DecodeTables {
    /// The k source split indices, lowest first.
    sources: [u8; MAX_DATA_SPLITS],
    /// The data split indices to rebuild, lowest first; `missing_count` of them are used.
    missing: [u8; MAX_PARITY_SPLITS],
    missing_count: usize,
    /// ISA-L tables for the rows of the inverse matrix that yield the missing splits.
    tables: Vec<u8>,
}

impl IsalCodec {
    /// Builds a coder for `params`, computing its encode tables.
    pub fn new(params: CodecParams) -> Self {
        let data_splits = params.data_splits;
        let parity_splits = params.parity_splits;
        let generator = generator_matrix(data_splits, parity_splits);
        let mut encode_tables = vec![0u8; 32 * data_splits * parity_splits];
        if parity_splits > 0 {
            isal_ffi::init_tables(
                data_splits,
                parity_splits,
                &generator[data_splits * data_splits..],
                &mut encode_tables,
            );
        }
        Self { params, encode_tables, decode_cache: HashMap::default() }
    }

    fn build_decode_tables(params: &CodecParams, sources_mask: u32) -> DecodeTables {
        let data_splits = params.data_splits;
        let generator = generator_matrix(data_splits, params.parity_splits);
        let mut rows = source_rows(&generator, data_splits, sources_mask);
        let mut inverse = vec![0u8; data_splits * data_splits];
        // Any k rows of a Cauchy-systematic generator are independent (MDS): see matrix.rs.
        assert!(
            isal_ffi::invert_matrix(&mut rows, &mut inverse, data_splits),
            "generator submatrix for sources {sources_mask:#x} is singular: the code is not MDS"
        );
        let mut sources = [0u8; MAX_DATA_SPLITS];
        for (slot, split) in sources.iter_mut().zip(set_bits(sources_mask)) {
            *slot = split as u8;
        }
        let mut missing = [0u8; MAX_PARITY_SPLITS];
        let mut missing_count = 0;
        let mut coefficients = Vec::with_capacity(MAX_PARITY_SPLITS * data_splits);
        for split in set_bits(!sources_mask & params.data_splits_mask()) {
            missing[missing_count] = split as u8;
            missing_count += 1;
            // Row `split` of the inverse turns the k sources back into data split `split`.
            coefficients.extend_from_slice(&inverse[split * data_splits..(split + 1) * data_splits]);
        }
        let mut tables = vec![0u8; 32 * data_splits * missing_count];
        isal_ffi::init_tables(data_splits, missing_count, &coefficients, &mut tables);
        DecodeTables { sources, missing, missing_count, tables }
    }

    /// Number of erasure patterns whose decode tables are cached.
    pub fn cached_patterns(&self) -> usize {
        self.decode_cache.len()
    }
}

impl PageCodec for IsalCodec {
    fn params(&self) -> CodecParams {
        self.params
    }

    fn encode(&mut self, page: &[u8], parity: &mut [u8]) {
        assert_encode_buffers(&self.params, page, parity);
        let data_splits = self.params.data_splits;
        let parity_splits = self.params.parity_splits;
        if parity_splits == 0 {
            return;
        }
        let split_bytes = self.params.split_bytes();
        let mut sources = [std::ptr::null::<u8>(); MAX_DATA_SPLITS];
        for (index, source) in sources[..data_splits].iter_mut().enumerate() {
            *source = page[index * split_bytes..].as_ptr();
        }
        let mut destinations = [std::ptr::null_mut::<u8>(); MAX_PARITY_SPLITS];
        for (index, destination) in destinations[..parity_splits].iter_mut().enumerate() {
            *destination = parity[index * split_bytes..].as_mut_ptr();
        }
        // SAFETY: the lengths were asserted above, so each source is a split_bytes range inside
        // `page` and each destination a split_bytes range inside `parity`; the destinations are
        // disjoint from each other, and from the sources because `parity` is an exclusive borrow.
        unsafe {
            isal_ffi::encode_data(
                split_bytes,
                &self.encode_tables,
                &sources[..data_splits],
                &mut destinations[..parity_splits],
            );
        }
    }

    fn decode(&mut self, page: &mut [u8], parity: &[u8], present: u32) -> Result<(), DecodeError> {
        let params = self.params;
        let sources_mask = match plan_decode(&params, page, parity, present)? {
            DecodePlan::NothingMissing => return Ok(()),
            DecodePlan::Rebuild { sources_mask } => sources_mask,
        };
        let decode = self
            .decode_cache
            .entry(sources_mask)
            .or_insert_with(|| Self::build_decode_tables(&params, sources_mask));
        let data_splits = params.data_splits;
        let split_bytes = params.split_bytes();
        // All page pointers come from this one raw pointer, so the reads of present data splits
        // and the writes of missing ones do not go through overlapping Rust references.
        let page_base = page.as_mut_ptr();
        let mut sources = [std::ptr::null::<u8>(); MAX_DATA_SPLITS];
        for (source, &split) in sources[..data_splits].iter_mut().zip(&decode.sources) {
            let split = usize::from(split);
            *source = if split < data_splits {
                // SAFETY: split < k, so split * split_bytes + split_bytes <= page_bytes, the
                // length of `page` (checked by plan_decode).
                unsafe { page_base.add(split * split_bytes) }
            } else {
                parity[(split - data_splits) * split_bytes..].as_ptr()
            };
        }
        let mut destinations = [std::ptr::null_mut::<u8>(); MAX_PARITY_SPLITS];
        for (destination, &split) in destinations[..decode.missing_count].iter_mut().zip(&decode.missing) {
            // SAFETY: missing splits are data splits (< k), so the range is inside `page`.
            *destination = unsafe { page_base.add(usize::from(split) * split_bytes) };
        }
        // SAFETY: every pointer addresses a split_bytes range inside `page` or `parity`, whose
        // lengths plan_decode checked. Destinations are missing data splits, which are distinct
        // from each other and not among the sources (sources are present splits), so no range
        // overlaps another; `parity` is only read.
        unsafe {
            isal_ffi::encode_data(
                split_bytes,
                &decode.tables,
                &sources[..data_splits],
                &mut destinations[..decode.missing_count],
            );
        }
        Ok(())
    }
}

/// Hashes a split mask with one multiply: the default SipHash would cost a noticeable part of a
/// 50 ns decode, and the keys are not attacker-controlled.
#[derive(Default)]
struct MaskHasher(u64);

impl Hasher for MaskHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, value: u32) {
        // Fold the high half down: the table indexes buckets with the low bits, and the low bits
        // of a product depend only on the low bits of the key.
        let product = u64::from(value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = product ^ (product >> 32);
    }
}
