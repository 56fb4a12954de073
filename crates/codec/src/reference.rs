//! The scalar reference coder: byte-at-a-time GF(2^8) arithmetic, no tables cached, no SIMD.
//!
//! It exists to check [`crate::IsalCodec`] byte for byte (SIMD paths are tested against a scalar
//! reference). It shares only the generator matrix and the choice of source splits with the fast
//! coder; the matrix inversion and the multiply-accumulate loops are its own. It is slow (about a
//! microsecond per KiB) and allocates on every decode: never use it on a data path.

use crate::matrix::{generator_matrix, invert, multiply, source_rows};
use crate::page_codec::{assert_encode_buffers, plan_decode, set_bits, DecodeError, DecodePlan, PageCodec};
use crate::params::CodecParams;

/// Scalar Reed-Solomon page coder with the same generator matrix as [`crate::IsalCodec`].
pub struct ReferenceCodec {
    params: CodecParams,
    generator: Vec<u8>,
}

impl ReferenceCodec {
    /// Builds a reference coder for `params`.
    pub fn new(params: CodecParams) -> Self {
        Self { params, generator: generator_matrix(params.data_splits, params.parity_splits) }
    }
}

impl PageCodec for ReferenceCodec {
    fn params(&self) -> CodecParams {
        self.params
    }

    fn encode(&mut self, page: &[u8], parity: &mut [u8]) {
        assert_encode_buffers(&self.params, page, parity);
        let data_splits = self.params.data_splits;
        let split_bytes = self.params.split_bytes();
        for (parity_index, parity_split) in parity.chunks_exact_mut(split_bytes).enumerate() {
            let row = &self.generator[(data_splits + parity_index) * data_splits..][..data_splits];
            parity_split.fill(0);
            for (coefficient, data_split) in row.iter().zip(page.chunks_exact(split_bytes)) {
                for (out, &byte) in parity_split.iter_mut().zip(data_split) {
                    *out ^= multiply(*coefficient, byte);
                }
            }
        }
    }

    fn decode(&mut self, page: &mut [u8], parity: &[u8], present: u32) -> Result<(), DecodeError> {
        let sources_mask = match plan_decode(&self.params, page, parity, present)? {
            DecodePlan::NothingMissing => return Ok(()),
            DecodePlan::Rebuild { sources_mask } => sources_mask,
        };
        let data_splits = self.params.data_splits;
        let split_bytes = self.params.split_bytes();
        let rows = source_rows(&self.generator, data_splits, sources_mask);
        let inverse = invert(&rows, data_splits).expect("any k rows of an MDS generator invert");
        // Copy the sources out first: the missing splits are written into the same page.
        let sources: Vec<Vec<u8>> = set_bits(sources_mask)
            .map(|split| {
                if split < data_splits {
                    page[split * split_bytes..][..split_bytes].to_vec()
                } else {
                    parity[(split - data_splits) * split_bytes..][..split_bytes].to_vec()
                }
            })
            .collect();
        for missing in set_bits(!sources_mask & self.params.data_splits_mask()) {
            let output = &mut page[missing * split_bytes..][..split_bytes];
            output.fill(0);
            let row = &inverse[missing * data_splits..][..data_splits];
            for (coefficient, source) in row.iter().zip(&sources) {
                for (out, &byte) in output.iter_mut().zip(source) {
                    *out ^= multiply(*coefficient, byte);
                }
            }
        }
        Ok(())
    }
}
