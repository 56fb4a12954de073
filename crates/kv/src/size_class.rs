//! The size classes `stats slabs` and `stats items` report by: memcached 1.6's slab classes
//! with its default settings (`-n 48`, `-f 1.25`, 8-byte alignment, `slab_chunk_max` 512 KiB),
//! applied to the bytes an item counts against `--memory-limit` (key + value + 56).
//!
//! remem keeps no slabs: values go to pages and chunks in remote memory (`space.rs`, whose own
//! chunk classes only pack value tails). These classes only group items for reporting, so that
//! tools and memcached's own tests that read per-class figures (`1:used_chunks`,
//! `items:31:reclaimed`) find items where memcached would put them: an item of 66,560 bytes is in
//! class 31 on both. Items above the largest class (memcached chunks those) count in the largest.
//! docs/KV.md "Conformance" says what each figure means here.

/// memcached's smallest chunk: its 48-byte item header plus `-n 48`.
const SMALLEST_BYTES: usize = 96;
/// memcached's `slab_chunk_max` (half of its 1 MiB page): the largest class.
const LARGEST_BYTES: usize = 512 * 1024;
const ALIGN_BYTES: usize = 8;

/// The chunk size of each class; class `n` (memcached numbers them from 1) is `sizes()[n - 1]`.
pub fn sizes() -> &'static [usize] {
    static SIZES: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    SIZES.get_or_init(|| {
        // memcached's slabs_init: grow by 1.25 (aligned up) until the next step would pass
        // slab_chunk_max / 1.25, then one last class of slab_chunk_max.
        let mut sizes = Vec::new();
        let mut size = SMALLEST_BYTES as f64;
        loop {
            let aligned = (size as usize).next_multiple_of(ALIGN_BYTES);
            if aligned as f64 >= LARGEST_BYTES as f64 / 1.25 {
                break;
            }
            sizes.push(aligned);
            size = aligned as f64 * 1.25;
        }
        sizes.push(LARGEST_BYTES);
        sizes
    })
}

/// Classes there are: the ids run from 1 to this.
pub fn count() -> usize {
    sizes().len()
}

/// The class (1-based, as memcached numbers them) of an item of `item_bytes`: the smallest whose
/// chunk holds it, the largest for anything bigger.
pub fn of(item_bytes: u64) -> usize {
    let position = sizes().partition_point(|&size| (size as u64) < item_bytes);
    position.min(count() - 1) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_memcacheds_default_slab_classes() {
        // What Debian's memcached 1.6 reports in `stats slabs` (-m 128, default settings).
        assert_eq!(&sizes()[..4], &[96, 120, 152, 192]);
        assert_eq!(sizes()[30], 82_792);
        assert_eq!(count(), 39);
        assert_eq!(sizes()[38], 512 * 1024);
        assert!(sizes().windows(2).all(|pair| pair[0] < pair[1] && pair[0] % ALIGN_BYTES == 0));
    }

    #[test]
    fn items_land_where_memcached_puts_them() {
        // t/issue_29.t: an empty value is class 1; t/issue_163.t: 66,560 bytes are class 31.
        assert_eq!(of(crate::index::item_bytes(7, 0)), 1);
        assert_eq!(of(96), 1);
        assert_eq!(of(97), 2);
        assert_eq!(of(crate::index::item_bytes(3, 66_560)), 31);
        assert_eq!(of(crate::index::item_bytes(3, 66_570)), 31);
        assert_eq!(of(512 * 1024), 39);
        assert_eq!(of(1 << 30), 39);
        assert_eq!(of(0), 1);
    }
}
