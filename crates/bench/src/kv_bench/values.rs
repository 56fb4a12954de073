//! The bench's values: every value carries its key index, so a read of the wrong object is
//! seen.

/// A value of `length` bytes for key `index`: the index in the first 8 bytes (when it fits),
/// then bytes that depend on position and index.
pub fn value_for(index: u64, generation: u64, length: usize) -> Vec<u8> {
    let mut value: Vec<u8> = (0..length)
        .map(|position| (position as u64).wrapping_mul(31).wrapping_add(index * 7 + generation * 13) as u8)
        .collect();
    stamp(&mut value, index);
    value
}

pub(super) fn stamp(value: &mut [u8], index: u64) {
    let bytes = index.to_le_bytes();
    let length = value.len().min(8);
    value[..length].copy_from_slice(&bytes[..length]);
}

/// Cheap check of a value written by [`value_for`] (generation 0) with [`stamp`]: length,
/// stamped index and the last byte.
pub(super) fn looks_right(value: &[u8], index: u64, length: usize) -> bool {
    if value.len() != length {
        return false;
    }
    let bytes = index.to_le_bytes();
    let stamped = length.min(8);
    if value[..stamped] != bytes[..stamped] {
        return false;
    }
    length <= 8 || value[length - 1] == ((length as u64 - 1).wrapping_mul(31).wrapping_add(index * 7) as u8)
}
