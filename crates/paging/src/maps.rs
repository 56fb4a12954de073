//! Which memory of the process the pager manages: its private anonymous read-write mappings
//! (`/proc/self/maps`) of at least `min_bytes`, plus the brk heap and every piece that
//! begins where a managed range ends, whatever their size.
//!
//! Why a size threshold (1 MiB by default): the memory of a memory-hungry program is in a few
//! large mappings (the brk heap, malloc's arenas, allocations above malloc's mmap threshold,
//! which grows to 32 MiB, and the program's own big mmaps), while the small ones are the
//! loader's, libraries' .bss and small thread allocations: managing them would register many
//! mappings for little memory. Pieces that extend a managed range upwards are managed because
//! malloc's arenas grow in small steps (132 KiB at a time, each step a mapping of its own beside
//! the registered part); the brk heap's steps are all named `[heap]`. Why mappings are found by reading /proc/self/maps and not by wrapping
//! mmap: glibc's malloc calls its internal mmap and brk, which no LD_PRELOAD wrapper sees.

/// A mapping: `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub heap: bool,
    /// Right above an inaccessible guard mapping: a thread's stack, whose top holds glibc's
    /// thread descriptor (see `STACK_TOP_PINNED`).
    pub guarded: bool,
}

/// Bytes at the top of a thread's stack the pager never evicts: glibc keeps the thread's
/// descriptor and static TLS there, and links every thread's descriptor into one list that
/// creating or ending any thread (the pager's client makes threads) writes to.
pub const STACK_TOP_PINNED: u64 = 32 << 10;

/// The private anonymous read-write mappings of a `/proc/PID/maps` text.
pub fn anonymous_mappings(text: &str) -> Vec<Mapping> {
    let mut found = Vec::new();
    // The previous line's end, when it was a small inaccessible mapping (a guard).
    let mut guard_end = None;
    for line in text.lines() {
        let previous_guard = guard_end.take();
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms), Some(_offset), Some(_device), Some(inode)) =
            (fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let name = fields.next().unwrap_or("");
        let Some((start, end)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16)) else {
            continue;
        };
        if perms == "---p" && end > start && end - start <= 64 << 10 {
            guard_end = Some(end);
        }
        if perms != "rw-p" || inode != "0" || !(name.is_empty() || name == "[heap]") {
            continue;
        }
        if start < end {
            found.push(Mapping {
                start,
                end,
                heap: name == "[heap]",
                guarded: previous_guard == Some(start),
            });
        }
    }
    found
}

/// Every mapping's `[start, end)`, whatever it is.
pub fn all_mappings(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|line| {
            let (start, end) = line.split_whitespace().next()?.split_once('-')?;
            Some((u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?))
        })
        .collect()
}

/// Ranges already managed, kept sorted and merged.
#[derive(Default)]
pub struct Managed {
    ranges: Vec<(u64, u64)>,
}

impl Managed {
    pub fn add(&mut self, start: u64, end: u64) {
        self.ranges.push((start, end));
        self.ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.ranges.len());
        for &(start, end) in &self.ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        self.ranges = merged;
    }

    pub fn remove(&mut self, start: u64, end: u64) {
        let mut kept = Vec::with_capacity(self.ranges.len() + 1);
        for &(a, b) in &self.ranges {
            if b <= start || a >= end {
                kept.push((a, b));
                continue;
            }
            if a < start {
                kept.push((a, start));
            }
            if b > end {
                kept.push((end, b));
            }
        }
        self.ranges = kept;
    }

    /// `[from, from + len)` moved to `[to, to + len)` (mremap's REMAP event): what of it was in
    /// these ranges is there now, and the target's old contents are gone (mremap unmaps them).
    pub fn moved(&mut self, from: u64, to: u64, len: u64) {
        let end = from.saturating_add(len);
        let inside: Vec<(u64, u64)> = self
            .ranges
            .iter()
            .filter_map(|&(a, b)| {
                let (start, stop) = (a.max(from), b.min(end));
                (start < stop).then(|| (start - from, stop - from))
            })
            .collect();
        self.remove(from, end);
        self.remove(to, to.saturating_add(len));
        for (start, stop) in inside {
            self.add(to + start, to + stop);
        }
    }

    /// On the fault path (prefetch, write-protection): a binary search of the sorted ranges.
    pub fn contains(&self, address: u64) -> bool {
        let after = self.ranges.partition_point(|&(start, _)| start <= address);
        after > 0 && address < self.ranges[after - 1].1
    }

    /// `[start, end)` overlaps a managed range or begins where one ends (a heap growing up).
    fn extends(&self, start: u64, end: u64) -> bool {
        self.ranges.iter().any(|&(a, b)| a < end && start <= b)
    }

    /// The parts of `[start, end)` not managed yet.
    pub fn missing(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut parts = Vec::new();
        let mut cursor = start;
        for &(a, b) in &self.ranges {
            if b <= cursor || a >= end {
                continue;
            }
            if a > cursor {
                parts.push((cursor, a));
            }
            cursor = cursor.max(b);
        }
        if cursor < end {
            parts.push((cursor, end));
        }
        parts
    }

    pub fn total_bytes(&self) -> u64 {
        self.ranges.iter().map(|&(a, b)| b - a).sum()
    }
}

/// The parts of the process's mappings to start managing: big enough, the heap or beside a
/// managed range, never overlapping `excluded` (the pager's own memory and stack).
pub fn to_manage(
    mappings: &[Mapping],
    managed: &Managed,
    excluded: &[(u64, u64)],
    min_bytes: u64,
) -> Vec<(u64, u64)> {
    let mut parts = Vec::new();
    for mapping in mappings {
        if excluded.iter().any(|&(a, b)| a < mapping.end && mapping.start < b) {
            continue;
        }
        let wanted = mapping.heap
            || mapping.end - mapping.start >= min_bytes
            || managed.extends(mapping.start, mapping.end);
        if wanted {
            parts.extend(managed.missing(mapping.start, mapping.end));
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55e0c0000000-55e0c0021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000200000 rw-p 00000000 00:00 0 
7f0000200000-7f0000201000 ---p 00000000 00:00 0 
7f0000201000-7f0000a01000 rw-p 00000000 00:00 0 
7f0000300000-7f0000301000 rw-p 00000000 00:00 0 
7f0000400000-7f0000500000 rw-p 00001000 fd:01 1234                       /usr/lib/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn only_private_anonymous_read_write_mappings_and_the_heap_are_found() {
        let found = anonymous_mappings(MAPS);
        assert_eq!(
            found,
            vec![
                Mapping { start: 0x55e0_c000_0000, end: 0x55e0_c002_1000, heap: true, guarded: false },
                Mapping { start: 0x7f00_0000_0000, end: 0x7f00_0020_0000, heap: false, guarded: false },
                Mapping { start: 0x7f00_0020_1000, end: 0x7f00_00a0_1000, heap: false, guarded: true },
                Mapping { start: 0x7f00_0030_0000, end: 0x7f00_0030_1000, heap: false, guarded: false },
            ]
        );
    }

    #[test]
    fn big_mappings_the_heap_and_pieces_beside_managed_ranges_are_managed_once() {
        let found = anonymous_mappings(MAPS);
        let mut managed = Managed::default();
        let parts = to_manage(&found, &managed, &[], 1 << 20);
        assert_eq!(
            parts,
            vec![
                (0x55e0_c000_0000, 0x55e0_c002_1000),
                (0x7f00_0000_0000, 0x7f00_0020_0000),
                (0x7f00_0020_1000, 0x7f00_00a0_1000)
            ]
        );
        for &(a, b) in &parts {
            managed.add(a, b);
        }
        assert!(to_manage(&found, &managed, &[], 1 << 20).is_empty(), "nothing twice");
        // The heap grows by a piece: only the piece is new.
        let grown = [Mapping { start: 0x55e0_c002_1000, end: 0x55e0_c004_2000, heap: false, guarded: false }];
        assert_eq!(to_manage(&grown, &managed, &[], 1 << 20), vec![(0x55e0_c002_1000, 0x55e0_c004_2000)]);
        // The pager's own memory is never managed.
        let excluded = [(0x7f00_0010_0000, 0x7f00_0010_1000)];
        assert_eq!(to_manage(&found, &Managed::default(), &excluded, 1 << 20).len(), 2);
    }

    #[test]
    fn removing_a_middle_piece_splits_a_managed_range() {
        let mut managed = Managed::default();
        managed.add(0x1000, 0x9000);
        managed.remove(0x3000, 0x4000);
        assert!(managed.contains(0x2000) && !managed.contains(0x3000) && managed.contains(0x4000));
        assert_eq!(managed.missing(0x0, 0xa000), vec![(0x0, 0x1000), (0x3000, 0x4000), (0x9000, 0xa000)]);
        assert_eq!(managed.total_bytes(), 0x7000);
    }

    #[test]
    fn a_moved_range_takes_its_pieces_along_and_clears_its_target() {
        let mut pinned = Managed::default();
        pinned.add(0x100, 0x200);
        pinned.add(0x2000, 0x3000);
        pinned.add(0x9000, 0xb000);
        pinned.add(0x20000, 0x21000);
        // [0x1000, 0xa000) moves to [0x20000, 0x29000): its pieces at 0x2000 and 0x9000 follow
        // (offsets 0x1000 and 0x8000), the piece beyond it at 0xa000 stays, and what was pinned
        // at the target is gone.
        pinned.moved(0x1000, 0x20000, 0x9000);
        assert!(!pinned.contains(0x2000) && !pinned.contains(0x9000) && pinned.contains(0xa000));
        assert!(pinned.contains(0x21000) && pinned.contains(0x28000) && !pinned.contains(0x20000));
        assert!(pinned.contains(0x100), "a piece before the moved range stays");
        assert_eq!(pinned.total_bytes(), 0x100 + 0x1000 + 0x1000 + 0x1000);
    }
}
