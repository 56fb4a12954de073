//! The one place that decides what a split read back is worth, and which version of a page a
//! set of splits holds. The client's reads and the node's rebuilds both call these, so "valid",
//! "never written" and "newest version" mean the same thing everywhere.
//!
//! Version 0 with checksum 0 is a slot never written (or left empty by a rebuild): it holds no
//! data and counts as version 0, older than every written version. Any other split counts only
//! if its end-to-end checksum matches its bytes, version, page and split index; version 0 with
//! a nonzero checksum is corrupt.

use crate::data::{finish_split_checksum, version_is_newer, SplitMeta};

/// What one split read back from a slab is worth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitVerdict {
    /// The checksum passed: the split holds this written version (1..=255).
    Valid { version: u8 },
    /// The slot was never written: the page had no data here (version 0).
    NeverWritten,
    /// The checksum failed: flipped bits, a torn write, or a split of another slot.
    Corrupt,
}

impl SplitVerdict {
    /// The version this split vouches for (0 when never written), or `None` when corrupt.
    pub fn version(self) -> Option<u8> {
        match self {
            SplitVerdict::Valid { version } => Some(version),
            SplitVerdict::NeverWritten => Some(0),
            SplitVerdict::Corrupt => None,
        }
    }
}

/// Judges split `split_index` of page `page` as read: its payload and the metadata stored beside
/// it.
pub fn judge_split(payload: &[u8], meta: SplitMeta, page: u64, split_index: u8) -> SplitVerdict {
    if meta.version == 0 {
        return if meta.checksum == 0 { SplitVerdict::NeverWritten } else { SplitVerdict::Corrupt };
    }
    judge_split_crc(crc32c::crc32c(payload), meta, page, split_index)
}

/// [`judge_split`] with `crc32c(payload)` computed beforehand.
pub fn judge_split_crc(payload_crc: u32, meta: SplitMeta, page: u64, split_index: u8) -> SplitVerdict {
    if meta.version == 0 {
        return if meta.checksum == 0 { SplitVerdict::NeverWritten } else { SplitVerdict::Corrupt };
    }
    if finish_split_checksum(payload_crc, meta.version, page, split_index) == meta.checksum {
        SplitVerdict::Valid { version: meta.version }
    } else {
        SplitVerdict::Corrupt
    }
}

/// The newest version that at least `k` of `versions` share, if any (0 = never written takes
/// part like any other version and loses to every written one). A page is readable at that
/// version from those `k` splits; splits of other versions are stale or torn and never mixed in.
pub fn newest_with_k(versions: impl Iterator<Item = u8> + Clone, k: usize) -> Option<u8> {
    let mut best: Option<u8> = None;
    for version in versions.clone() {
        let newer = match best {
            None => true,
            Some(best) => version_is_newer(version, best),
        };
        if newer && versions.clone().filter(|other| *other == version).count() >= k {
            best = Some(version);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::split_checksum;

    #[test]
    fn never_written_corrupt_and_valid_are_told_apart() {
        let payload = [7u8; 64];
        let checksum = split_checksum(&payload, 3, 10, 2);
        let valid = SplitMeta { version: 3, checksum };
        assert_eq!(judge_split(&payload, valid, 10, 2), SplitVerdict::Valid { version: 3 });
        assert_eq!(judge_split(&payload, valid, 11, 2), SplitVerdict::Corrupt);
        assert_eq!(judge_split(&payload, valid, 10, 1), SplitVerdict::Corrupt);
        let empty = SplitMeta { version: 0, checksum: 0 };
        assert_eq!(judge_split(&payload, empty, 10, 2), SplitVerdict::NeverWritten);
        let bad_empty = SplitMeta { version: 0, checksum: 5 };
        assert_eq!(judge_split(&payload, bad_empty, 10, 2), SplitVerdict::Corrupt);
    }

    #[test]
    fn newest_version_needs_k_and_wraps_and_zero_is_oldest() {
        assert_eq!(newest_with_k([5, 5, 6].into_iter(), 2), Some(5));
        assert_eq!(newest_with_k([5, 6, 6].into_iter(), 2), Some(6));
        assert_eq!(newest_with_k([5, 6].into_iter(), 2), None);
        assert_eq!(newest_with_k([255, 255, 1, 1].into_iter(), 2), Some(1));
        assert_eq!(newest_with_k([0, 0, 4].into_iter(), 2), Some(0));
        assert_eq!(newest_with_k([0, 0, 4, 4].into_iter(), 2), Some(4));
        assert_eq!(newest_with_k(std::iter::empty(), 1), None);
    }
}
