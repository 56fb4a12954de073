//! The contract every page coder meets, and the decode bookkeeping the coders share.
//!
//! Layout (Hydra section 4.1.3, coding in place): data split `i < k` is
//! `page[i * split_bytes..(i + 1) * split_bytes]`; parity split `k + j` is
//! `parity[j * split_bytes..(j + 1) * split_bytes]`. Nothing is copied in or out: encode reads
//! the page and writes the parity buffer, decode reads the present splits and writes the missing
//! data splits straight into the page.
//!
//! Which splits a decode uses is fixed here, once for all coders: the `k` lowest-numbered present
//! splits. Present data splits therefore always take part, and parity splits fill in for the
//! missing ones in index order. The same choice in [`crate::ReferenceCodec`] and
//! [`crate::IsalCodec`] is what lets the tests compare them byte for byte.

use crate::params::{CodecParams, MAX_TOTAL_SPLITS};

/// Why a page could not be decoded. The page is untouched when decode returns an error.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer than k splits are present: the page is lost (more than r splits failed).
    #[error("page lost: {present} splits present, {needed} needed")]
    TooFewSplits { present: usize, needed: usize },
    /// A buffer handed to decode has the wrong length for these parameters.
    #[error("{buffer} buffer is {len} bytes, expected {expected}")]
    BufferSize { buffer: BufferKind, len: usize, expected: usize },
    /// The presence mask has bits set at or above `k + r`: there are no such splits.
    #[error("presence mask {present:#x} names splits beyond the {total_splits} of this code")]
    UnknownSplits { present: u32, total_splits: usize },
}

/// Which of the two buffers of a page a [`DecodeError::BufferSize`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferKind {
    Page,
    Parity,
}

impl std::fmt::Display for BufferKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            BufferKind::Page => "page",
            BufferKind::Parity => "parity",
        })
    }
}

/// Encodes and decodes pages with one fixed [`CodecParams`].
///
/// One coder per thread: decode caches tables per erasure pattern, so it takes `&mut self`.
/// Implementations must produce identical bytes for the same parameters: they all use the
/// generator matrix of [`crate::matrix::generator_matrix`].
pub trait PageCodec: Send {
    /// The parameters this coder was built for.
    fn params(&self) -> CodecParams;

    /// Computes the r parity splits of `page` into `parity`.
    ///
    /// # Panics
    /// If `page.len() != page_bytes` or `parity.len() != parity_bytes()`: a programmer error.
    /// With r = 0 this checks the lengths and does nothing else.
    fn encode(&mut self, page: &[u8], parity: &mut [u8]);

    /// Rebuilds, in place in `page`, every data split whose bit in `present` is clear.
    ///
    /// `present` is a bitmask over split indices `0..k+r`: bit i set means split i holds valid
    /// bytes (data split i < k lives in `page`, parity split k + j in `parity`). The rebuild uses
    /// the k lowest-numbered present splits. Does nothing if all k data bits are set. Parity
    /// splits are never rebuilt: re-encode the page for that.
    ///
    /// # Errors
    /// [`DecodeError::TooFewSplits`] if fewer than k bits are set, [`DecodeError::BufferSize`] if
    /// a buffer has the wrong length, [`DecodeError::UnknownSplits`] if bits at or above k + r are
    /// set. `page` is unchanged on error.
    fn decode(&mut self, page: &mut [u8], parity: &[u8], present: u32) -> Result<(), DecodeError>;
}

/// Checks the lengths of both buffers of a page against `params`; panics on a mismatch.
pub(crate) fn assert_encode_buffers(params: &CodecParams, page: &[u8], parity: &[u8]) {
    assert_eq!(page.len(), params.page_bytes, "page buffer has the wrong length");
    assert_eq!(parity.len(), params.parity_bytes(), "parity buffer has the wrong length");
}

/// What a decode has to do, derived from the presence mask alone (so it can key a table cache).
pub(crate) enum DecodePlan {
    /// Every data split is present: nothing to rebuild.
    NothingMissing,
    /// Rebuild from the k splits in `sources_mask` (the k lowest present ones).
    Rebuild { sources_mask: u32 },
}

/// Validates a decode call and picks its source splits.
pub(crate) fn plan_decode(
    params: &CodecParams,
    page: &[u8],
    parity: &[u8],
    present: u32,
) -> Result<DecodePlan, DecodeError> {
    if page.len() != params.page_bytes {
        return Err(DecodeError::BufferSize {
            buffer: BufferKind::Page,
            len: page.len(),
            expected: params.page_bytes,
        });
    }
    if parity.len() != params.parity_bytes() {
        return Err(DecodeError::BufferSize {
            buffer: BufferKind::Parity,
            len: parity.len(),
            expected: params.parity_bytes(),
        });
    }
    if present & !params.all_splits_mask() != 0 {
        return Err(DecodeError::UnknownSplits { present, total_splits: params.total_splits() });
    }
    let data_mask = params.data_splits_mask();
    if present & data_mask == data_mask {
        return Ok(DecodePlan::NothingMissing);
    }
    let present_count = present.count_ones() as usize;
    if present_count < params.data_splits {
        return Err(DecodeError::TooFewSplits { present: present_count, needed: params.data_splits });
    }
    // Keep the k lowest set bits: clear the highest ones until k remain.
    let mut sources_mask = present;
    for _ in params.data_splits..present_count {
        sources_mask &= !(1u32 << (31 - sources_mask.leading_zeros()));
    }
    debug_assert_eq!(sources_mask.count_ones() as usize, params.data_splits);
    debug_assert!(sources_mask.trailing_zeros() < MAX_TOTAL_SPLITS as u32);
    Ok(DecodePlan::Rebuild { sources_mask })
}

/// Split indices whose bit is set in `mask`, lowest first.
pub(crate) fn set_bits(mask: u32) -> impl Iterator<Item = usize> {
    (0..32usize).filter(move |index| mask & (1u32 << index) != 0)
}
