//! The fast coder against the scalar reference and against the page itself: every k of the k + r
//! splits must rebuild the page, byte for byte, for every allowed (k, r).

use proptest::prelude::*;
use rand::{rngs::StdRng, Rng, SeedableRng};
use remem_codec::{
    bench, new_codec, BufferKind, CodecParams, DecodeError, IsalCodec, PageCodec, ParamsError, ReferenceCodec,
};

const ALL_DATA_SPLITS: [usize; 5] = [1, 2, 4, 8, 16];

fn random_page(params: &CodecParams, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..params.page_bytes).map(|_| rng.gen()).collect()
}

/// The page as a reader holding only the `present` splits sees it: lost data splits are garbage.
fn damage(params: &CodecParams, page: &[u8], present: u32) -> Vec<u8> {
    let split_bytes = params.split_bytes();
    let mut damaged = page.to_vec();
    for split in 0..params.data_splits {
        if present & (1 << split) == 0 {
            damaged[split * split_bytes..][..split_bytes].fill(0xa5);
        }
    }
    damaged
}

fn masks_with_popcount(total_splits: usize, count: usize) -> impl Iterator<Item = u32> {
    (0u32..1 << total_splits).filter(move |mask| mask.count_ones() as usize == count)
}

/// Encodes with both coders, checks the parities agree, and returns them.
fn encode_both(params: CodecParams, page: &[u8]) -> Vec<u8> {
    let mut fast_parity = vec![0u8; params.parity_bytes()];
    let mut reference_parity = vec![0x5au8; params.parity_bytes()];
    IsalCodec::new(params).encode(page, &mut fast_parity);
    ReferenceCodec::new(params).encode(page, &mut reference_parity);
    assert_eq!(fast_parity, reference_parity, "parity differs from the reference for {params:?}");
    fast_parity
}

#[test]
fn every_k_subset_restores_the_page_for_every_k_and_r() {
    for data_splits in ALL_DATA_SPLITS {
        for parity_splits in 0..=4 {
            let params = CodecParams::new(data_splits, parity_splits, 4096).expect("valid");
            let page = random_page(&params, (data_splits * 10 + parity_splits) as u64);
            let parity = encode_both(params, &page);
            let mut fast = IsalCodec::new(params);
            let mut reference = ReferenceCodec::new(params);
            for (pattern, present) in masks_with_popcount(params.total_splits(), data_splits).enumerate() {
                let mut damaged = damage(&params, &page, present);
                fast.decode(&mut damaged, &parity, present).expect("k splits present");
                assert!(damaged == page, "{params:?} present {present:#b}: fast decode wrong");
                // The scalar reference costs ~0.1 ms a decode: check it on a sample.
                if pattern % 7 == 0 {
                    let mut damaged = damage(&params, &page, present);
                    reference.decode(&mut damaged, &parity, present).expect("k splits present");
                    assert!(damaged == page, "{params:?} present {present:#b}: reference wrong");
                }
            }
        }
    }
}

#[test]
fn replication_k1_parity_is_a_copy_of_the_page() {
    let params = CodecParams::new(1, 3, 4096).expect("valid");
    let page = random_page(&params, 1);
    let parity = encode_both(params, &page);
    for copy in parity.chunks_exact(4096) {
        assert!(copy == page);
    }
}

#[test]
fn no_redundancy_r0_encodes_nothing_and_decodes_only_a_whole_page() {
    let params = CodecParams::new(8, 0, 4096).expect("valid");
    let mut codec = new_codec(params);
    let mut page = random_page(&params, 2);
    let original = page.clone();
    codec.encode(&page, &mut []);
    codec.decode(&mut page, &[], 0xff).expect("all data present");
    assert_eq!(page, original);
    assert!(matches!(
        codec.decode(&mut page, &[], 0xfe),
        Err(DecodeError::TooFewSplits { present: 7, needed: 8 })
    ));
}

#[test]
fn page_sizes_4096_8192_65536_round_trip_losing_two_data_splits_k8_r2() {
    for page_bytes in [4096, 8192, 65536] {
        let params = CodecParams::new(8, 2, page_bytes).expect("valid");
        assert_eq!(params.split_bytes(), page_bytes / 8);
        let page = random_page(&params, page_bytes as u64);
        let parity = encode_both(params, &page);
        let present = 0b11_1101_1011; // data splits 2 and 5 lost
        let mut damaged = damage(&params, &page, present);
        new_codec(params).decode(&mut damaged, &parity, present).expect("8 present");
        assert!(damaged == page, "page_bytes {page_bytes}");
    }
}

#[test]
fn decode_of_a_lost_page_reports_too_few_splits_and_leaves_the_page_alone_k8_r2() {
    let params = CodecParams::new(8, 2, 4096).expect("valid");
    let mut codec = new_codec(params);
    let page = random_page(&params, 3);
    let mut parity = vec![0u8; params.parity_bytes()];
    codec.encode(&page, &mut parity);
    let present = 0b11_1111_1000; // three data splits lost, only seven splits left
    let mut damaged = damage(&params, &page, present);
    let before = damaged.clone();
    let error = codec.decode(&mut damaged, &parity, present).expect_err("page is lost");
    assert!(matches!(error, DecodeError::TooFewSplits { present: 7, needed: 8 }), "{error}");
    assert_eq!(damaged, before);
}

#[test]
fn decode_rejects_wrong_buffers_and_unknown_splits() {
    let params = CodecParams::new(4, 2, 4096).expect("valid");
    let mut codec = new_codec(params);
    let mut page = vec![0u8; 4096];
    let parity = vec![0u8; 2048];
    assert_eq!(
        codec.decode(&mut page[..4095], &parity, 0b111110).expect_err("short page"),
        DecodeError::BufferSize { buffer: BufferKind::Page, len: 4095, expected: 4096 }
    );
    assert_eq!(
        codec.decode(&mut page, &parity[..1024], 0b111110).expect_err("short parity"),
        DecodeError::BufferSize { buffer: BufferKind::Parity, len: 1024, expected: 2048 }
    );
    assert_eq!(
        codec.decode(&mut page, &parity, 0b1111110).expect_err("split 6 does not exist"),
        DecodeError::UnknownSplits { present: 0b1111110, total_splits: 6 }
    );
}

#[test]
#[should_panic(expected = "parity buffer has the wrong length")]
fn encode_with_a_short_parity_buffer_is_a_programmer_error() {
    let params = CodecParams::new(8, 2, 4096).expect("valid");
    new_codec(params).encode(&[0u8; 4096], &mut [0u8; 512]);
}

#[test]
fn params_reject_out_of_range_values() {
    assert_eq!(
        CodecParams::new(0, 2, 4096),
        Err(ParamsError::DataSplitsOutOfRange { data_splits: 0, max: 16 })
    );
    assert_eq!(
        CodecParams::new(17, 2, 4096),
        Err(ParamsError::DataSplitsOutOfRange { data_splits: 17, max: 16 })
    );
    assert_eq!(
        CodecParams::new(8, 5, 4096),
        Err(ParamsError::ParitySplitsOutOfRange { parity_splits: 5, max: 4 })
    );
    for page_bytes in [0, 2048, 4095, 6144, 1 << 31] {
        assert!(
            matches!(CodecParams::new(8, 2, page_bytes), Err(ParamsError::PageBytesInvalid { .. })),
            "page_bytes {page_bytes}"
        );
    }
    assert_eq!(
        CodecParams::new(3, 2, 4096),
        Err(ParamsError::SplitsDoNotDividePage { data_splits: 3, page_bytes: 4096 })
    );
    let params = CodecParams::new(16, 4, 8192).expect("valid");
    assert_eq!((params.split_bytes(), params.total_splits(), params.parity_bytes()), (512, 20, 2048));
}

#[test]
fn decode_tables_are_cached_once_per_loss_pattern_k8_r2() {
    let params = CodecParams::new(8, 2, 4096).expect("valid");
    let mut codec = IsalCodec::new(params);
    let page = random_page(&params, 4);
    let mut parity = vec![0u8; params.parity_bytes()];
    codec.encode(&page, &mut parity);
    for _ in 0..3 {
        for present in masks_with_popcount(10, 8).chain(masks_with_popcount(10, 9)) {
            let mut damaged = damage(&params, &page, present);
            codec.decode(&mut damaged, &parity, present).expect("enough splits");
            assert!(damaged == page);
        }
    }
    // Patterns that lose no data split need no tables; the rest are keyed by their 8 sources.
    let with_lost_data = masks_with_popcount(10, 8).filter(|mask| mask & 0xff != 0xff).count();
    assert_eq!(codec.cached_patterns(), with_lost_data);
}

#[test]
fn bench_measure_runs_with_tiny_iterations() {
    let timings = bench::measure(&mut *new_codec(CodecParams::new(8, 2, 4096).expect("valid")), 10);
    assert!(timings.encode_ns > 0.0);
    assert!(timings.decode_one_lost_ns.is_some() && timings.decode_two_lost_ns.is_some());
    let replication =
        bench::measure(&mut ReferenceCodec::new(CodecParams::new(1, 1, 4096).expect("valid")), 2);
    assert!(replication.decode_one_lost_ns.is_some() && replication.decode_two_lost_ns.is_none());
    let bare = bench::measure(&mut *new_codec(CodecParams::new(4, 0, 4096).expect("valid")), 10);
    assert_eq!((bare.decode_one_lost_ns, bare.decode_two_lost_ns), (None, None));
}

fn params_strategy() -> impl Strategy<Value = CodecParams> {
    (0u32..=4, 0usize..=4, prop_oneof![4 => Just(4096usize), 1 => Just(8192), 1 => Just(65536)]).prop_map(
        |(log_data_splits, parity_splits, page_bytes)| {
            CodecParams::new(1 << log_data_splits, parity_splits, page_bytes).expect("valid")
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random pages and random survivor sets (k or more splits, any of them).
    #[test]
    fn fast_and_reference_agree_and_restore_the_page(
        params in params_strategy(),
        seed in any::<u64>(),
        survivor_bits in any::<u32>(),
    ) {
        let page = random_page(&params, seed);
        let parity = encode_both(params, &page);
        // Start from random bits, then add splits (lowest first) until k are present.
        let mut present = survivor_bits & params.all_splits_mask();
        let mut next = 0;
        while (present.count_ones() as usize) < params.data_splits {
            present |= 1 << next;
            next += 1;
        }
        let mut fast_page = damage(&params, &page, present);
        let mut reference_page = fast_page.clone();
        IsalCodec::new(params).decode(&mut fast_page, &parity, present).expect("k present");
        ReferenceCodec::new(params).decode(&mut reference_page, &parity, present).expect("k present");
        prop_assert!(fast_page == page);
        prop_assert!(reference_page == page);
    }
}
