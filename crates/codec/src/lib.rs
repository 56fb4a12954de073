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
