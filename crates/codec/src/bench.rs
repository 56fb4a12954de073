//! Micro-benchmark of one coder: ns per page for encode and for decode with one and two lost
//! data splits, single-threaded and cache-hot.
//!
//! Methodology (kept identical for every coder, and for `crates/isal-baseline`, which compiles
//! this very file): one warm-up round, then `ROUNDS` timed rounds of `iterations` calls each;
//! the result is the median round divided by `iterations`. Decode loses data splits 0 (and 1), so
//! it does real work, and its tables are cached after the warm-up, as on the data path. The
//! decoded page is checked against the original after the timing, so a broken coder cannot post
//! a fast number.

use std::hint::black_box;
use std::time::Instant;

use crate::page_codec::PageCodec;

/// Timed rounds per measurement; the median is reported.
pub const ROUNDS: usize = 7;

/// Median ns per page. Decode timings are `None` when the code cannot lose that many splits
/// (r = 0 has no one-loss decode, r < 2 no two-loss decode).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodecTimings {
    pub encode_ns: f64,
    pub decode_one_lost_ns: Option<f64>,
    pub decode_two_lost_ns: Option<f64>,
}

/// Measures `codec`; see the module docs for the method. `iterations` is per round (use about
/// 100,000 for stable numbers on a 4 KiB page, 10 in tests).
///
/// # Panics
/// If `iterations` is 0, or if the coder fails to restore the page.
pub fn measure(codec: &mut dyn PageCodec, iterations: usize) -> CodecTimings {
    assert!(iterations > 0, "iterations must be positive");
    let params = codec.params();
    let page: Vec<u8> =
        (0..params.page_bytes).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut parity = vec![0u8; params.parity_bytes()];
    let mut working_page = page.clone();

    let encode_ns = median_ns_per_call(iterations, || {
        codec.encode(black_box(&working_page), black_box(&mut parity));
    });

    let mut decode_ns = |lost_data_splits: u32| -> Option<f64> {
        let lost = lost_data_splits as usize;
        if params.parity_splits < lost || params.data_splits < lost {
            return None;
        }
        let present = params.all_splits_mask() & !((1u32 << lost) - 1);
        let ns = median_ns_per_call(iterations, || {
            codec
                .decode(black_box(&mut working_page), black_box(&parity), present)
                .expect("k splits are present");
        });
        assert_eq!(working_page, page, "decode did not restore the page");
        Some(ns)
    };
    let decode_one_lost_ns = decode_ns(1);
    let decode_two_lost_ns = decode_ns(2);
    CodecTimings { encode_ns, decode_one_lost_ns, decode_two_lost_ns }
}

fn median_ns_per_call(iterations: usize, mut call: impl FnMut()) -> f64 {
    for _ in 0..iterations {
        call();
    }
    let mut rounds = [0f64; ROUNDS];
    for round in &mut rounds {
        let start = Instant::now();
        for _ in 0..iterations {
            call();
        }
        *round = start.elapsed().as_nanos() as f64 / iterations as f64;
    }
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}
