//! Scalar GF(2^8) arithmetic and the generator matrix of the code.
//!
//! The field is GF(2)[x] / (x^8 + x^4 + x^3 + x^2 + 1) (polynomial 0x11d), the one ISA-L uses, so
//! a matrix built here means the same thing to ISA-L's kernels and to [`crate::ReferenceCodec`].
//!
//! The generator matrix is systematic: `(k + r) x k`, rows `0..k` the identity (data splits are
//! stored as they are) and rows `k..k+r` the parity coefficients. For k >= 2 the parity rows are
//! ISA-L's `gf_gen_cauchy1_matrix`: entry (i, j) = 1 / (i xor j). Row labels `k..k+r` and column
//! labels `0..k` are disjoint, so this is a Cauchy matrix and every square submatrix of it is
//! invertible: any k of the k + r splits rebuild the page (MDS), for every allowed k and r.
//! For k = 1 every parity coefficient is 1 instead, so parity splits are plain copies of the page
//! (replication); a 1 x 1 matrix of a nonzero element is trivially invertible, so this is MDS too.

/// Field polynomial without the x^8 term: ISA-L's 0x11d.
const POLYNOMIAL_LOW_BITS: u8 = 0x1d;

/// `EXP[i] = 2^i` for i in 0..510 (doubled so a sum of two logs indexes it without a modulo).
static EXP: [u8; 510] = build_exp_table();
/// `LOG[a]` = the i with 2^i = a, for a != 0. `LOG[0]` is unused.
static LOG: [u8; 256] = build_log_table();

const fn build_exp_table() -> [u8; 510] {
    let mut table = [0u8; 510];
    let mut value: u8 = 1;
    let mut index = 0;
    while index < 510 {
        table[index] = value;
        let carry = value & 0x80 != 0;
        value <<= 1;
        if carry {
            value ^= POLYNOMIAL_LOW_BITS;
        }
        index += 1;
    }
    table
}

const fn build_log_table() -> [u8; 256] {
    let exp = build_exp_table();
    let mut table = [0u8; 256];
    let mut index = 0;
    while index < 255 {
        table[exp[index] as usize] = index as u8;
        index += 1;
    }
    table
}

/// Product of two field elements.
pub fn multiply(left: u8, right: u8) -> u8 {
    if left == 0 || right == 0 {
        return 0;
    }
    EXP[LOG[left as usize] as usize + LOG[right as usize] as usize]
}

/// Multiplicative inverse of a nonzero field element.
///
/// # Panics
/// If `value == 0`, which has no inverse.
pub fn inverse(value: u8) -> u8 {
    assert_ne!(value, 0, "zero has no inverse in GF(2^8)");
    EXP[255 - LOG[value as usize] as usize]
}

/// The `(k + r) x k` generator matrix, row-major: `matrix[row * k + column]`.
pub fn generator_matrix(data_splits: usize, parity_splits: usize) -> Vec<u8> {
    let total_splits = data_splits + parity_splits;
    assert!(total_splits <= 256, "Cauchy labels must be distinct field elements");
    let mut matrix = vec![0u8; total_splits * data_splits];
    for row in 0..total_splits {
        for column in 0..data_splits {
            matrix[row * data_splits + column] = if row < data_splits {
                u8::from(row == column)
            } else if data_splits == 1 {
                1
            } else {
                // row and column are < 256 (asserted above) and distinct, so row ^ column != 0.
                inverse((row ^ column) as u8)
            };
        }
    }
    matrix
}

/// The `k x k` matrix of the generator rows of the splits in `sources_mask`, lowest index first:
/// multiplying it by the data splits gives those source splits.
pub fn source_rows(generator: &[u8], data_splits: usize, sources_mask: u32) -> Vec<u8> {
    let mut rows = Vec::with_capacity(data_splits * data_splits);
    for split in crate::page_codec::set_bits(sources_mask) {
        rows.extend_from_slice(&generator[split * data_splits..(split + 1) * data_splits]);
    }
    assert_eq!(rows.len(), data_splits * data_splits, "sources_mask must name exactly k splits");
    rows
}

/// Inverts the `n x n` row-major `matrix` by Gauss-Jordan elimination; `None` if it is singular.
pub fn invert(matrix: &[u8], n: usize) -> Option<Vec<u8>> {
    assert_eq!(matrix.len(), n * n);
    let mut left = matrix.to_vec();
    let mut right = vec![0u8; n * n];
    for index in 0..n {
        right[index * n + index] = 1;
    }
    for column in 0..n {
        let pivot_row = (column..n).find(|&row| left[row * n + column] != 0)?;
        if pivot_row != column {
            for position in 0..n {
                left.swap(pivot_row * n + position, column * n + position);
                right.swap(pivot_row * n + position, column * n + position);
            }
        }
        let scale = inverse(left[column * n + column]);
        for position in 0..n {
            left[column * n + position] = multiply(left[column * n + position], scale);
            right[column * n + position] = multiply(right[column * n + position], scale);
        }
        for row in 0..n {
            let factor = left[row * n + column];
            if row == column || factor == 0 {
                continue;
            }
            for position in 0..n {
                left[row * n + position] ^= multiply(factor, left[column * n + position]);
                right[row * n + position] ^= multiply(factor, right[column * n + position]);
            }
        }
    }
    Some(right)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nonzero_element_times_its_inverse_is_one() {
        for value in 1..=255u8 {
            assert_eq!(multiply(value, inverse(value)), 1, "value {value}");
        }
    }

    #[test]
    fn multiply_matches_carryless_reduction() {
        fn slow_multiply(mut left: u8, mut right: u8) -> u8 {
            let mut product = 0u8;
            while right != 0 {
                if right & 1 != 0 {
                    product ^= left;
                }
                let carry = left & 0x80 != 0;
                left <<= 1;
                if carry {
                    left ^= POLYNOMIAL_LOW_BITS;
                }
                right >>= 1;
            }
            product
        }
        for left in 0..=255u8 {
            for right in 0..=255u8 {
                assert_eq!(multiply(left, right), slow_multiply(left, right));
            }
        }
    }

    #[test]
    fn generator_matrix_k1_is_replication() {
        assert_eq!(generator_matrix(1, 3), vec![1, 1, 1, 1]);
    }
}
