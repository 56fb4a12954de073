//! CRC-32C of several equal-length splits at once, for the paths that judge k splits of a page in
//! a row (a rebuild judges k source splits per page, then checksums the rebuilt one).
//!
//! Written here because no crate offers it: `crc32c` computes one buffer at a time, and on a
//! 512-byte split it runs one chain of `crc32` instructions, each waiting three cycles for the
//! last. Three or four independent splits interleaved keep the unit busy every cycle, about three
//! times the throughput (`remem bench regen` spent 28% of its rebuild thread in `crc32c` before).
//! The result is exactly `crc32c::crc32c` of each payload; tests compare them on every length.

/// `crc32c::crc32c(payloads[i])` into `out[i]` for every i; `out` must be at least as long as
/// `payloads`. Runs of equal-length payloads are checksummed four (or three, or two) at a time.
pub fn payload_crcs(payloads: &[&[u8]], out: &mut [u32]) {
    assert!(out.len() >= payloads.len(), "one output per payload");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        let mut at = 0;
        while at < payloads.len() {
            let length = payloads[at].len();
            let run = payloads[at..].iter().take(4).take_while(|payload| payload.len() == length).count();
            if run < 2 {
                out[at] = crc32c::crc32c(payloads[at]);
            } else {
                // SAFETY: the CPU has SSE4.2, checked just above.
                unsafe { interleaved_into(&payloads[at..at + run], &mut out[at..at + run]) };
            }
            at += run.max(1);
        }
        return;
    }
    for (payload, crc) in payloads.iter().zip(out.iter_mut()) {
        *crc = crc32c::crc32c(payload);
    }
}

/// `crc32c::crc32c_append(payload_crc, version || page (little endian) || split_index)` in three
/// `crc32` instructions: through the crate, a 10-byte append is a dispatched call and a byte
/// loop, and an EC(8,2) read finishes eight of them (`data::finish_split_checksum`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
pub(crate) fn append_trailer(payload_crc: u32, version: u8, page: u64, split_index: u8) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let crc = _mm_crc32_u8(!payload_crc, version);
    // crc32 of a u64 takes its bytes low first: the page's little-endian bytes.
    let crc = _mm_crc32_u64(u64::from(crc), page) as u32;
    !_mm_crc32_u8(crc, split_index)
}

/// [`interleaved`] of 2 to 4 equal-length payloads into `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn interleaved_into(payloads: &[&[u8]], out: &mut [u32]) {
    match payloads.len() {
        4 => out.copy_from_slice(&interleaved::<4>(payloads)),
        3 => out.copy_from_slice(&interleaved::<3>(payloads)),
        2 => out.copy_from_slice(&interleaved::<2>(payloads)),
        _ => unreachable!("groups of 2 to 4"),
    }
}

/// CRC-32C (initial value and final xor all ones, as `crc32c::crc32c`) of `N` buffers of the
/// same length, their `crc32` chains interleaved.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn interleaved<const N: usize>(payloads: &[&[u8]]) -> [u32; N] {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let payloads: &[&[u8]; N] = payloads.try_into().expect("N payloads");
    let length = payloads[0].len();
    debug_assert!(payloads.iter().all(|payload| payload.len() == length));
    let words = length / 8;
    let mut wide = [u64::from(u32::MAX); N];
    for word in 0..words {
        for (crc, payload) in wide.iter_mut().zip(payloads) {
            let bytes: [u8; 8] = payload[word * 8..word * 8 + 8].try_into().expect("eight bytes");
            *crc = _mm_crc32_u64(*crc, u64::from_le_bytes(bytes));
        }
    }
    let mut crcs = wide.map(|crc| crc as u32);
    for at in words * 8..length {
        for (crc, payload) in crcs.iter_mut().zip(payloads) {
            *crc = _mm_crc32_u8(*crc, payload[at]);
        }
    }
    crcs.map(|crc| !crc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trailer_appended_by_hand_equals_the_crates_append() {
        for (index, page) in [0u64, 1, 255, 256, 0x0123_4567_89ab_cdef, u64::MAX].into_iter().enumerate() {
            for version in [0u8, 1, 127, 255] {
                let payload_crc = crc32c::crc32c(&page.to_be_bytes()) ^ (index as u32);
                let mut trailer = [0u8; 10];
                trailer[0] = version;
                trailer[1..9].copy_from_slice(&page.to_le_bytes());
                trailer[9] = index as u8 * 37;
                let expected = crc32c::crc32c_append(payload_crc, &trailer);
                assert_eq!(
                    crate::finish_split_checksum(payload_crc, version, page, index as u8 * 37),
                    expected,
                    "page {page}, version {version}"
                );
            }
        }
    }

    #[test]
    fn every_length_and_grouping_equals_crc32c_one_at_a_time() {
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for length in [0, 1, 7, 8, 9, 63, 64, 512, 513, 1024] {
            for count in 0..8 {
                let payloads: Vec<&[u8]> = (0..count).map(|i| &bytes[i * 311..i * 311 + length]).collect();
                let mut out = vec![0u32; count];
                payload_crcs(&payloads, &mut out);
                for (payload, crc) in payloads.iter().zip(&out) {
                    assert_eq!(*crc, crc32c::crc32c(payload), "length {length}, {count} payloads");
                }
            }
        }
        // Unequal lengths in a group fall back to one at a time.
        let payloads: Vec<&[u8]> = vec![&bytes[..512], &bytes[1..512], &bytes[2..600], &bytes[3..515]];
        let mut out = [0u32; 4];
        payload_crcs(&payloads, &mut out);
        for (payload, crc) in payloads.iter().zip(&out) {
            assert_eq!(*crc, crc32c::crc32c(payload));
        }
    }
}
