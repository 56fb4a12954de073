//! codec-compare: the candidate Reed-Solomon crates on one page, cache-hot, single-threaded,
//! ns per page for encode and for decode with one and two lost data splits.
//!
//! Same method as `remem_codec::bench`: warm-up round, 7 timed rounds, median. Each candidate is
//! driven through its lowest-allocation API with its decode matrices computed once per loss
//! pattern where the crate lets us (that is the cache a real client keeps).
//! Run: `cargo run --release` in this directory; results go into docs/CODEC.md.

use std::hint::black_box;
use std::time::Instant;

const ROUNDS: usize = 7;
const ITERATIONS: usize = 20_000;
const PAGE_BYTES: usize = 4096;

fn median_ns(iterations: usize, mut call: impl FnMut()) -> f64 {
    for _ in 0..iterations {
        call();
    }
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                call();
            }
            start.elapsed().as_nanos() as f64 / iterations as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

fn test_page() -> Vec<u8> {
    (0..PAGE_BYTES).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

struct Row {
    name: &'static str,
    encode_ns: f64,
    decode_ns: [f64; 2],
}

fn remem_codec_isal(k: usize, r: usize) -> Row {
    use remem_codec::CodecParams;
    let params = CodecParams::new(k, r, PAGE_BYTES).expect("valid");
    let mut codec = remem_codec::IsalCodec::new(params);
    let timings = remem_codec::bench::measure(&mut codec, ITERATIONS);
    Row {
        name: "erasure-isa-l 0.3 low-level ec::/gf:: (ISA-L 2.32), via remem-codec",
        encode_ns: timings.encode_ns,
        decode_ns: [timings.decode_one_lost_ns.expect("r >= 1"), timings.decode_two_lost_ns.expect("r >= 2")],
    }
}

fn rusty_erasure(k: usize, r: usize) -> Row {
    use rusty_erasure::isal::{ec_encode_data, ec_init_tables, gf_gen_cauchy1_matrix, gf_invert_matrix};
    let split = PAGE_BYTES / k;
    let mut matrix = vec![0u8; (k + r) * k];
    gf_gen_cauchy1_matrix(&mut matrix, k + r, k).expect("cauchy");
    let mut encode_tables = vec![0u8; 32 * k * r];
    ec_init_tables(k, r, &matrix[k * k..], &mut encode_tables).expect("tables");
    let page = test_page();
    let mut parity = vec![0u8; r * split];
    let encode_ns = median_ns(ITERATIONS, || {
        let mut sources: [&[u8]; 16] = [&[]; 16];
        for (slot, chunk) in sources.iter_mut().zip(page.chunks_exact(split)) {
            *slot = chunk;
        }
        let mut coding: [&mut [u8]; 4] = Default::default();
        for (slot, chunk) in coding.iter_mut().zip(parity.chunks_exact_mut(split)) {
            *slot = chunk;
        }
        ec_encode_data(split, k, r, &encode_tables, &sources[..k], &mut coding[..r]).expect("encode");
        black_box(&coding);
    });
    let mut decode_ns = [0.0; 2];
    for lost in 1..=2 {
        // Sources: data splits lost..k, then parities 0..lost (the k lowest present splits).
        let mut rows = Vec::new();
        for split in (lost..k).chain(k..k + lost) {
            rows.extend_from_slice(&matrix[split * k..(split + 1) * k]);
        }
        let mut inverse = vec![0u8; k * k];
        gf_invert_matrix(&mut rows, &mut inverse, k).expect("invertible");
        let mut tables = vec![0u8; 32 * k * lost];
        ec_init_tables(k, lost, &inverse[..lost * k], &mut tables).expect("tables");
        let mut working = page.clone();
        decode_ns[lost - 1] = median_ns(ITERATIONS, || {
            let (lost_region, present_region) = working.split_at_mut(lost * split);
            let mut sources: [&[u8]; 16] = [&[]; 16];
            for (slot, chunk) in sources
                .iter_mut()
                .zip(present_region.chunks_exact(split).chain(parity.chunks_exact(split).take(lost)))
            {
                *slot = chunk;
            }
            let mut outputs: [&mut [u8]; 4] = Default::default();
            for (slot, chunk) in outputs.iter_mut().zip(lost_region.chunks_exact_mut(split)) {
                *slot = chunk;
            }
            ec_encode_data(split, k, lost, &tables, &sources[..k], &mut outputs[..lost]).expect("decode");
            black_box(&outputs);
        });
        assert_eq!(working, page, "rusty_erasure decode wrong");
    }
    Row { name: "rusty_erasure 0.4 isal:: API, tables cached", encode_ns, decode_ns }
}

fn reed_solomon_erasure(k: usize, r: usize) -> Row {
    use reed_solomon_erasure::galois_8::ReedSolomon;
    let split = PAGE_BYTES / k;
    let coder = ReedSolomon::new(k, r).expect("params");
    let page = test_page();
    let mut parity = vec![0u8; r * split];
    let encode_ns = median_ns(ITERATIONS, || {
        let data: Vec<&[u8]> = page.chunks_exact(split).collect();
        let mut coding: Vec<&mut [u8]> = parity.chunks_exact_mut(split).collect();
        coder.encode_sep(&data, &mut coding).expect("encode");
    });
    let mut decode_ns = [0.0; 2];
    for lost in 1..=2 {
        let mut working = page.clone();
        let mut parity_copy = parity.clone();
        decode_ns[lost - 1] = median_ns(ITERATIONS, || {
            let mut shards: Vec<(&mut [u8], bool)> = working
                .chunks_exact_mut(split)
                .chain(parity_copy.chunks_exact_mut(split))
                .enumerate()
                .map(|(index, chunk)| (chunk, index >= lost))
                .collect();
            coder.reconstruct_data(&mut shards).expect("decode");
        });
        assert_eq!(working, page, "reed-solomon-erasure decode wrong");
    }
    Row { name: "reed-solomon-erasure 6 (simd-accel), LRU matrix cache", encode_ns, decode_ns }
}

fn reed_solomon_simd(k: usize, r: usize) -> Row {
    use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
    let split = PAGE_BYTES / k;
    let page = test_page();
    let mut encoder = ReedSolomonEncoder::new(k, r, split).expect("params");
    let mut parity = vec![0u8; r * split];
    let encode_ns = median_ns(ITERATIONS, || {
        for chunk in page.chunks_exact(split) {
            encoder.add_original_shard(chunk).expect("shard");
        }
        let result = encoder.encode().expect("encode");
        for (out, recovery) in parity.chunks_exact_mut(split).zip(result.recovery_iter()) {
            out.copy_from_slice(recovery);
        }
    });
    let mut decoder = ReedSolomonDecoder::new(k, r, split).expect("params");
    let mut decode_ns = [0.0; 2];
    // Decode costs ~100 us here (an FFT over the whole code per call): fewer iterations.
    for lost in 1..=2 {
        let mut working = page.clone();
        decode_ns[lost - 1] = median_ns(ITERATIONS / 100, || {
            decoder.reset(k, r, split).expect("reset");
            for index in lost..k {
                decoder.add_original_shard(index, &working[index * split..][..split]).expect("shard");
            }
            for index in 0..lost {
                decoder.add_recovery_shard(index, &parity[index * split..][..split]).expect("shard");
            }
            let result = decoder.decode().expect("decode");
            let restored: Vec<(usize, &[u8])> = result.restored_original_iter().collect();
            for (index, bytes) in restored {
                working[index * split..][..split].copy_from_slice(bytes);
            }
        });
        assert_eq!(working, page, "reed-solomon-simd decode wrong");
    }
    Row { name: "reed-solomon-simd 3 (Leopard FFT), encoder/decoder reused", encode_ns, decode_ns }
}

fn main() {
    println!("| (k, r), split | crate | encode ns | decode 1 lost ns | decode 2 lost ns |");
    println!("| --- | --- | --- | --- | --- |");
    for (k, r) in [(8, 2), (4, 2)] {
        for row in
            [remem_codec_isal(k, r), rusty_erasure(k, r), reed_solomon_erasure(k, r), reed_solomon_simd(k, r)]
        {
            println!(
                "| ({k}, {r}), {} B | {} | {:.0} | {:.0} | {:.0} |",
                PAGE_BYTES / k,
                row.name,
                row.encode_ns,
                row.decode_ns[0],
                row.decode_ns[1]
            );
        }
    }
}
