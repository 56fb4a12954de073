//! remem-codec: Reed-Solomon coding of one page into k data splits and r parity splits, in place
//! (Hydra section 4.1).
//!
//! Job: given a page, compute r parity splits so that any k of the k + r splits rebuild it; given
//! the splits that survived, rebuild the lost data splits. Replication (k = 1) and no redundancy
//! (r = 0) are the same code with other parameters.
//!
//! Invariants:
//! - **Architecture Invariant:** the codec does no I/O, knows nothing of nodes, versions or
//!   checksums, and never allocates per page once a loss pattern has been seen.
//! - In place: data splits are slices of the caller's page, parities go to a caller-owned buffer,
//!   decode writes missing data splits straight into the page (layout in [`PageCodec`]).
//! - Every coder produces identical bytes for the same [`CodecParams`] (one generator matrix,
//!   [`matrix::generator_matrix`]); [`ReferenceCodec`] is the scalar model that checks
//!   [`IsalCodec`].
//!
//! Fault model: the caller says which splits are valid (`present`); a split that failed its
//! checksum is simply absent. The codec corrects erasures only, never errors.

pub mod bench;
mod isal;
mod isal_ffi;
pub mod matrix;
mod page_codec;
mod params;
mod reference;

pub use isal::IsalCodec;
pub use page_codec::{BufferKind, DecodeError, PageCodec};
pub use params::{
    CodecParams, ParamsError, MAX_DATA_SPLITS, MAX_PAGE_BYTES, MAX_PARITY_SPLITS, MAX_TOTAL_SPLITS,
    MIN_PAGE_BYTES,
};
pub use reference::ReferenceCodec;

/// The fast coder for `params`: [`IsalCodec`]. One per thread.
pub fn new_codec(params: CodecParams) -> Box<dyn PageCodec> {
    Box::new(IsalCodec::new(params))
}

/// Where split `split_index` of a page lives in a decoder's buffers: data splits (`< k`) in
/// `page`, parity splits in `parity`, `split_bytes` each. Panics if the split is past the buffers.
pub fn split_buffer_mut<'a>(
    page: &'a mut [u8],
    parity: &'a mut [u8],
    data_splits: usize,
    split_bytes: usize,
    split_index: usize,
) -> &'a mut [u8] {
    if split_index < data_splits {
        &mut page[split_index * split_bytes..(split_index + 1) * split_bytes]
    } else {
        let parity_index = split_index - data_splits;
        &mut parity[parity_index * split_bytes..(parity_index + 1) * split_bytes]
    }
}
