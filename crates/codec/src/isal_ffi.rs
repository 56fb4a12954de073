//! The three ISA-L entry points the fast coder needs, from the `erasure-isa-l` crate (which builds
//! the vendored ISA-L 2.32 with its AVX-512 and GFNI kernels).
//!
//! `crates/isal-baseline` has a file of the same name and shape that binds Debian's libisal 2.30
//! instead, so that `isal.rs` runs unchanged over either library and the two are measured with
//! the very same Rust code. Keep the two files' signatures identical.
//!
//! `erasure_isa_l::ec::encode_data` is a safe function that dereferences raw pointers without any
//! check, so [`encode_data`] is `unsafe` here: that is where the obligation really lies.

/// Expands `rows x data_splits` coefficients into ISA-L's multiplication tables.
pub(crate) fn init_tables(data_splits: usize, rows: usize, coefficients: &[u8], tables: &mut [u8]) {
    assert_eq!(coefficients.len(), rows * data_splits);
    assert_eq!(tables.len(), 32 * rows * data_splits);
    erasure_isa_l::ec::init_tables(
        i32::try_from(data_splits).expect("at most 16 data splits"),
        i32::try_from(rows).expect("at most 4 rows"),
        coefficients,
        tables,
    );
}

/// Writes `destinations[row] = sum over j of coefficient(row, j) * sources[j]`, `split_bytes`
/// bytes each, with the tables of [`init_tables`].
///
/// # Safety
/// Every pointer in `sources` must be valid for reads and every pointer in `destinations` valid
/// for writes of `split_bytes` bytes, and no destination range may overlap another destination
/// or any source range.
pub(crate) unsafe fn encode_data(
    split_bytes: usize,
    tables: &[u8],
    sources: &[*const u8],
    destinations: &mut [*mut u8],
) {
    assert_eq!(tables.len(), 32 * sources.len() * destinations.len());
    erasure_isa_l::ec::encode_data(
        i32::try_from(split_bytes).expect("split_bytes is at most MAX_PAGE_BYTES"),
        i32::try_from(sources.len()).expect("at most 16 sources"),
        i32::try_from(destinations.len()).expect("at most 4 destinations"),
        tables,
        sources,
        destinations,
    );
}

/// Inverts the `n x n` matrix `input` into `output`, destroying `input`; false if singular.
pub(crate) fn invert_matrix(input: &mut [u8], output: &mut [u8], n: usize) -> bool {
    assert_eq!(input.len(), n * n);
    assert_eq!(output.len(), n * n);
    erasure_isa_l::gf::invert_matrix(input, output, i32::try_from(n).expect("n <= 16"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{generator_matrix, invert, source_rows};

    #[test]
    fn generator_matrix_matches_isal_cauchy1_for_k_at_least_2() {
        for data_splits in 2..=16 {
            for parity_splits in 0..=4 {
                let total = data_splits + parity_splits;
                let mut isal = vec![0u8; total * data_splits];
                erasure_isa_l::gf::gen_cauchy1_matrix(&mut isal, total as i32, data_splits as i32);
                assert_eq!(
                    generator_matrix(data_splits, parity_splits),
                    isal,
                    "k={data_splits} r={parity_splits}"
                );
            }
        }
    }

    #[test]
    fn scalar_inverse_agrees_with_isal_inverse() {
        let generator = generator_matrix(8, 4);
        // Data splits 2..8 and parities 10 and 11.
        let sources_mask = 0b1100_1111_1100;
        let rows = source_rows(&generator, 8, sources_mask);
        let inverted = invert(&rows, 8).expect("Cauchy submatrices are invertible");
        let mut isal_input = rows.clone();
        let mut isal_output = vec![0u8; 64];
        assert!(invert_matrix(&mut isal_input, &mut isal_output, 8));
        assert_eq!(inverted, isal_output);
        assert_eq!(invert(&inverted, 8).expect("an inverse is invertible"), rows);
    }
}
