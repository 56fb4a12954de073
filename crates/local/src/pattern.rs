//! Deterministic page contents, so that every page read back can be checked without keeping a
//! copy: the bytes of page P at write generation G are a function of (P, G, seed).

/// Fills `page` with the pattern of (`page_number`, `generation`, `seed`).
pub fn fill(page: &mut [u8], page_number: u64, generation: u64, seed: u64) {
    let mut state = seed
        ^ page_number.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ generation.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        | 1;
    for chunk in page.chunks_exact_mut(8) {
        // xorshift64*: cheap and different for every (page, generation).
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        chunk.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
}

/// True when `page` holds the pattern of (`page_number`, `generation`, `seed`).
pub fn check(page: &[u8], page_number: u64, generation: u64, seed: u64, scratch: &mut [u8]) -> bool {
    fill(scratch, page_number, generation, seed);
    page == scratch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_page_and_generation() {
        let mut a = vec![0; 4096];
        let mut b = vec![0; 4096];
        fill(&mut a, 1, 0, 7);
        fill(&mut b, 2, 0, 7);
        assert_ne!(a, b);
        fill(&mut b, 1, 1, 7);
        assert_ne!(a, b);
        let mut scratch = vec![0; 4096];
        assert!(check(&a, 1, 0, 7, &mut scratch));
    }
}
