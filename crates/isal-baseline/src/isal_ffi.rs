//! The three ISA-L entry points the coder needs, bound by hand to Debian's system libisal
//! (libisal-dev, ISA-L 2.30 on this Debian), which build.rs links with `-lisal`.
//!
//! Same signatures as `crates/codec/src/isal_ffi.rs`, so the shared `isal.rs` compiles against
//! either library unchanged.

use std::os::raw::{c_int, c_uchar};

// Declarations from ISA-L's include/erasure_code.h, stable since ISA-L 2.x.
extern "C" {
    fn ec_init_tables(k: c_int, rows: c_int, a: *mut c_uchar, gftbls: *mut c_uchar);
    fn ec_encode_data(
        len: c_int,
        k: c_int,
        rows: c_int,
        gftbls: *mut c_uchar,
        data: *mut *mut c_uchar,
        coding: *mut *mut c_uchar,
    );
    fn gf_invert_matrix(input: *mut c_uchar, output: *mut c_uchar, n: c_int) -> c_int;
    #[cfg(test)]
    fn gf_gen_cauchy1_matrix(a: *mut c_uchar, m: c_int, k: c_int);
}

/// Expands `rows x data_splits` coefficients into ISA-L's multiplication tables.
pub(crate) fn init_tables(data_splits: usize, rows: usize, coefficients: &[u8], tables: &mut [u8]) {
    assert_eq!(coefficients.len(), rows * data_splits);
    assert_eq!(tables.len(), 32 * rows * data_splits);
    // SAFETY: ec_init_tables reads rows * k coefficients and writes 32 * k * rows table bytes,
    // both lengths asserted above; it does not write through `a` despite the non-const pointer.
    unsafe {
        ec_init_tables(
            c_int::try_from(data_splits).expect("at most 16 data splits"),
            c_int::try_from(rows).expect("at most 4 rows"),
            coefficients.as_ptr().cast_mut(),
            tables.as_mut_ptr(),
        );
    }
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
    // SAFETY: the table length is asserted above; the caller guarantees the buffers. ISA-L only
    // reads through `gftbls` and the source pointers, despite their non-const types.
    unsafe {
        ec_encode_data(
            c_int::try_from(split_bytes).expect("split_bytes is at most MAX_PAGE_BYTES"),
            c_int::try_from(sources.len()).expect("at most 16 sources"),
            c_int::try_from(destinations.len()).expect("at most 4 destinations"),
            tables.as_ptr().cast_mut(),
            sources.as_ptr().cast::<*mut u8>().cast_mut(),
            destinations.as_mut_ptr(),
        );
    }
}

/// Inverts the `n x n` matrix `input` into `output`, destroying `input`; false if singular.
pub(crate) fn invert_matrix(input: &mut [u8], output: &mut [u8], n: usize) -> bool {
    assert_eq!(input.len(), n * n);
    assert_eq!(output.len(), n * n);
    // SAFETY: gf_invert_matrix reads and overwrites n * n bytes of `input` and writes n * n bytes
    // of `output`, both lengths asserted above.
    unsafe {
        gf_invert_matrix(input.as_mut_ptr(), output.as_mut_ptr(), c_int::try_from(n).expect("n <= 16")) == 0
    }
}

/// ISA-L's own Cauchy generator matrix, `(k + r) x k`, to check the shared matrix code against.
#[cfg(test)]
pub(crate) fn cauchy1_matrix(data_splits: usize, parity_splits: usize) -> Vec<u8> {
    let total_splits = data_splits + parity_splits;
    let mut matrix = vec![0u8; total_splits * data_splits];
    // SAFETY: gf_gen_cauchy1_matrix writes m * k bytes, the length of `matrix`.
    unsafe {
        gf_gen_cauchy1_matrix(
            matrix.as_mut_ptr(),
            c_int::try_from(total_splits).expect("at most 20 splits"),
            c_int::try_from(data_splits).expect("at most 16 data splits"),
        );
    }
    matrix
}
