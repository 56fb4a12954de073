//! The decision logic of the Resilience Manager, free of I/O (sans-I/O).
//!
//! A [`ReadState`] or [`WriteState`] takes events (a split arrived valid, arrived corrupt, its
//! node failed) and answers with what to do next (ask these splits, wait, done, lost). The TCP
//! driver in `io.rs` feeds it from sockets; a deterministic simulator can feed it from a model.
//!
//! Splits are numbered 0..k+r: 0..k are the data splits (slices of the page), k..k+r the
//! parities. Sets of splits are `u32` bit masks (k+r <= 20).
//!
//! Invariants:
//! - a read is `Done` only with k splits that passed their checksum and carry the expected
//!   version (or, when discovering an unknown version, the newest version that has k valid
//!   splits); anything else is an erasure, never decoded;
//! - a split is asked at most once per read, and only from a slab not known to be unavailable;
//! - a write is `Done` only when every split was acknowledged or failed, and it succeeds only if
//!   at least k splits were acknowledged (the page is still decodable);
//! - a data-only read (of a parity-stale page, see `engine/parity_stale.rs`) never asks a parity:
//!   it is `Done` with the k data splits or `Lost`; a data-only write needs every data split and
//!   a parity-only write needs none (the engine judges what its missing parities mean).

use remem_proto::{newest_with_k, version_is_newer};

/// A set of split indices.
pub type SplitMask = u32;

/// Coding shape of one client: k data splits, r parities, delta extra reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub data_splits: usize,
    pub parity_splits: usize,
    /// Extra splits asked on every read beyond k (late binding); capped at r.
    pub extra_reads: usize,
}

impl Shape {
    pub fn total_splits(&self) -> usize {
        self.data_splits + self.parity_splits
    }

    pub fn all_splits(&self) -> SplitMask {
        mask_below(self.total_splits())
    }

    pub fn data_mask(&self) -> SplitMask {
        mask_below(self.data_splits)
    }

    pub fn parity_mask(&self) -> SplitMask {
        self.all_splits() & !self.data_mask()
    }
}

pub fn mask_below(n: usize) -> SplitMask {
    assert!(n <= 32);
    if n == 32 {
        u32::MAX
    } else {
        (1u32 << n) - 1
    }
}

/// What became of one asked split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitOutcome {
    /// Checksum passed; the split carries this version.
    Valid { version: u8 },
    /// Checksum failed: corrupted in memory or torn.
    Corrupt,
    /// The node answered with an error, timed out or its connection died.
    Failed,
}

/// Next step of a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadStep {
    /// Nothing to do until the next reply.
    Wait,
    /// Send reads for these splits (not asked before), then wait.
    Ask(SplitMask),
    /// k valid splits of `version` are in. `present` has exactly k bits; decode if it lacks a
    /// data split. Version 0 (only in discovery) means the page was never written: zeros.
    Done { present: SplitMask, needs_decode: bool, version: u8 },
    /// Fewer than k valid splits can still arrive: the page cannot be read now.
    Lost { valid: SplitMask, failed: SplitMask },
}

/// One late-binding read of one page (seed 000 §4.1.2).
#[derive(Clone, Debug)]
pub struct ReadState {
    shape: Shape,
    /// The version the client last wrote; `None` while discovering (after a restart, when the
    /// client does not know it): then every available split is asked and the newest version
    /// with k valid splits wins.
    expected_version: Option<u8>,
    /// Version of each valid split (discovery only).
    versions: [u8; 32],
    unavailable: SplitMask,
    /// Splits this read never asks although their slabs are up: the parities of a parity-stale
    /// page, which do not hold its current version.
    excluded: SplitMask,
    asked: SplitMask,
    valid: SplitMask,
    failed: SplitMask,
    finished: bool,
}

impl ReadState {
    /// Starts a read of a page last written with `expected_version`. `unavailable` marks slabs
    /// known to be down. `extra_splits` (usually delta) are asked beyond k from the start.
    /// Returns the state and the first splits to ask: all data splits that are available (so no
    /// decode is needed when they come first), then parities up to k+extra in total.
    pub fn start(
        shape: Shape,
        expected_version: u8,
        unavailable: SplitMask,
        extra_splits: usize,
    ) -> (ReadState, ReadStep) {
        assert!(expected_version != 0, "a never-written page is not read remotely");
        let state = ReadState::new(shape, Some(expected_version), unavailable);
        state.first_ask(extra_splits)
    }

    /// Starts a read of a parity-stale page (written data splits only, at `expected_version`):
    /// only the k data splits are asked, never a parity, so the read is `Done` when all k are
    /// valid and `Lost` as soon as one is unavailable, failed, corrupt or of another version.
    pub fn start_data_only(
        shape: Shape,
        expected_version: u8,
        unavailable: SplitMask,
    ) -> (ReadState, ReadStep) {
        assert!(expected_version != 0, "a never-written page is not read remotely");
        let mut state = ReadState::new(shape, Some(expected_version), unavailable);
        state.excluded = shape.parity_mask();
        state.first_ask(0)
    }

    /// The first splits of a read that knows its version: every available data split, then
    /// others up to k + `extra_splits`.
    fn first_ask(mut self, extra_splits: usize) -> (ReadState, ReadStep) {
        let (shape, unavailable) = (self.shape, self.unavailable);
        let want = (shape.data_splits + extra_splits).min(shape.total_splits());
        let first = self.choose(want);
        let step = if (first.count_ones() as usize) < shape.data_splits || first == 0 {
            // Not enough available slabs to reach k: lost without asking anyone.
            self.finished = true;
            ReadStep::Lost { valid: 0, failed: unavailable }
        } else {
            self.asked = first;
            ReadStep::Ask(first)
        };
        (self, step)
    }

    /// A read that has asked nothing yet.
    fn new(shape: Shape, expected_version: Option<u8>, unavailable: SplitMask) -> ReadState {
        ReadState {
            shape,
            expected_version,
            versions: [0; 32],
            unavailable,
            excluded: 0,
            asked: 0,
            valid: 0,
            failed: 0,
            finished: false,
        }
    }

    /// Starts a read that does not know the page's version (a client restarted from its saved
    /// slab map, or torn writes suspected): asks every available split, waits for all of them,
    /// and completes with the newest version that has k valid splits (seed 000 §4.2; torn
    /// writes are never decoded as a mix). Lost if no version has k.
    pub fn discover(shape: Shape, unavailable: SplitMask) -> (ReadState, ReadStep) {
        let mut state = ReadState::new(shape, None, unavailable);
        let all = state.choose(shape.total_splits());
        if (all.count_ones() as usize) < shape.data_splits {
            state.finished = true;
            return (state, ReadStep::Lost { valid: 0, failed: unavailable });
        }
        state.asked = all;
        (state, ReadStep::Ask(all))
    }

    /// Discovery: once every asked split answered, the newest version with k valid splits, by
    /// the same rule as the node's rebuild (`remem_proto::newest_with_k`).
    fn discovery_verdict(&mut self) -> ReadStep {
        let k = self.shape.data_splits;
        let width = self.shape.total_splits();
        let valid = self.valid;
        let versions =
            (0..width).filter(|&split| valid & (1 << split) != 0).map(|split| self.versions[split]);
        self.finished = true;
        let Some(version) = newest_with_k(versions, k) else {
            return ReadStep::Lost { valid: self.valid, failed: self.failed | self.unavailable };
        };
        // Keep the k lowest splits of that version: data splits first, so decoding is rarest.
        let mut present: SplitMask = 0;
        for split in 0..width {
            if valid & (1 << split) != 0
                && self.versions[split] == version
                && (present.count_ones() as usize) < k
            {
                present |= 1 << split;
            }
        }
        let needs_decode = present & self.shape.data_mask() != self.shape.data_mask();
        ReadStep::Done { present, needs_decode, version }
    }

    /// Picks up to `count` unasked, available splits, data splits first.
    fn choose(&self, count: usize) -> SplitMask {
        let mut chosen = 0;
        let mut picked = 0;
        for split in 0..self.shape.total_splits() {
            if picked == count {
                break;
            }
            let bit = 1 << split;
            if (self.asked | self.unavailable | self.excluded) & bit == 0 {
                chosen |= bit;
                picked += 1;
            }
        }
        chosen
    }

    /// The newest version among the valid splits seen so far (discovery), if any.
    pub fn newest_version_seen(&self) -> Option<u8> {
        (0..self.shape.total_splits())
            .filter(|&split| self.valid & (1 << split) != 0)
            .map(|split| self.versions[split])
            .reduce(|newest, version| if version_is_newer(version, newest) { version } else { newest })
    }

    pub fn asked(&self) -> SplitMask {
        self.asked
    }

    /// The valid splits that carry `version` (discovery: which splits vouch for the verdict).
    pub fn valid_at(&self, version: u8) -> SplitMask {
        (0..self.shape.total_splits())
            .filter(|&split| self.valid & (1 << split) != 0 && self.versions[split] == version)
            .fold(0, |mask, split| mask | (1 << split))
    }

    pub fn valid(&self) -> SplitMask {
        self.valid
    }

    /// The data splits that are not in `present` and will not come: unavailable, failed,
    /// corrupt, or valid at another version (`present` as in [`ReadStep::Done`]).
    pub fn missing_data_splits(&self, present: SplitMask) -> SplitMask {
        self.shape.data_mask() & !present & !self.pending()
    }

    /// Splits asked and not yet answered.
    pub fn pending(&self) -> SplitMask {
        self.asked & !(self.valid | self.failed)
    }

    /// Feeds one reply. Replies for splits never asked, or after the read finished, are
    /// ignored (`Wait`): late binding drops late replies.
    pub fn on_reply(&mut self, split: usize, outcome: SplitOutcome) -> ReadStep {
        let bit = 1u32 << split;
        if self.finished || self.asked & bit == 0 || (self.valid | self.failed) & bit != 0 {
            return ReadStep::Wait;
        }
        let Some(expected_version) = self.expected_version else {
            match outcome {
                SplitOutcome::Valid { version } => {
                    self.valid |= bit;
                    self.versions[split] = version;
                }
                SplitOutcome::Corrupt | SplitOutcome::Failed => self.failed |= bit,
            }
            return if self.pending() == 0 { self.discovery_verdict() } else { ReadStep::Wait };
        };
        match outcome {
            SplitOutcome::Valid { version } if version == expected_version => {
                self.valid |= bit;
            }
            // A valid split of another version is stale or from a torn write: an erasure.
            SplitOutcome::Valid { .. } | SplitOutcome::Corrupt | SplitOutcome::Failed => {
                self.failed |= bit;
            }
        }
        let k = self.shape.data_splits;
        if self.valid.count_ones() as usize == k {
            self.finished = true;
            let needs_decode = self.valid & self.shape.data_mask() != self.shape.data_mask();
            return ReadStep::Done { present: self.valid, needs_decode, version: expected_version };
        }
        if self.failed & bit != 0 {
            // Replace the lost split with one not asked yet, if the total can still reach k.
            let in_play = (self.valid | self.pending()).count_ones() as usize;
            if in_play < k {
                let more = self.choose(k - in_play);
                if (in_play + more.count_ones() as usize) < k {
                    self.finished = true;
                    return ReadStep::Lost { valid: self.valid, failed: self.failed | self.unavailable };
                }
                self.asked |= more;
                return ReadStep::Ask(more);
            }
        }
        ReadStep::Wait
    }

    /// Asks `count` more splits now (a straggler deadline passed). `Wait` if none are left.
    pub fn hedge(&mut self, count: usize) -> ReadStep {
        if self.finished || self.expected_version.is_none() {
            return ReadStep::Wait;
        }
        let more = self.choose(count);
        if more == 0 {
            return ReadStep::Wait;
        }
        self.asked |= more;
        ReadStep::Ask(more)
    }
}

/// Next step of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteStep {
    Wait,
    /// Every split answered and enough were stored. `degraded` lists the splits the write was
    /// for that were not stored: their slabs must be rebuilt before the page has full redundancy
    /// again.
    Done {
        degraded: SplitMask,
    },
    /// Too few splits can be stored: the page's new version is not readable.
    Failed {
        stored: SplitMask,
        failed: SplitMask,
    },
}

/// One asynchronously encoded write (seed 000 §4.1.1): the driver sends the data splits, then
/// encodes and sends the parities; the write is complete when all k+r have answered.
///
/// The same machine runs the two halves of a page written in two steps (EC-oriented
/// replication): a data-only write (the k data splits, all needed) and a parity-only write (the
/// r parities, at the version the data splits already carry; none is needed for the write to end
/// `Done`, the engine judges the ones that were not stored).
#[derive(Clone, Debug)]
pub struct WriteState {
    /// The splits this write is for (all, the data splits or the parities).
    wanted: SplitMask,
    /// Splits that must be stored for the write to succeed.
    need: usize,
    targets: SplitMask,
    stored: SplitMask,
    failed: SplitMask,
    finished: bool,
}

impl WriteState {
    /// A whole write: every split, at least k stored. `unavailable` splits are not written at all
    /// (their slabs are down); they count as degraded from the start.
    pub fn start(shape: Shape, unavailable: SplitMask) -> (WriteState, WriteStep) {
        WriteState::start_of(shape.all_splits(), shape.data_splits, unavailable)
    }

    /// A data-only write: the k data splits, every one of them stored (an unavailable data slab
    /// fails it before anything is sent).
    pub fn start_data_only(shape: Shape, unavailable: SplitMask) -> (WriteState, WriteStep) {
        WriteState::start_of(shape.data_mask(), shape.data_splits, unavailable)
    }

    /// A parity-only write: the available parities; it ends `Done` when all have answered
    /// (at once if none is available), whatever was stored.
    pub fn start_parity_only(shape: Shape, unavailable: SplitMask) -> (WriteState, WriteStep) {
        WriteState::start_of(shape.parity_mask(), 0, unavailable)
    }

    fn start_of(wanted: SplitMask, need: usize, unavailable: SplitMask) -> (WriteState, WriteStep) {
        let targets = wanted & !unavailable;
        let failed = wanted & unavailable;
        let mut state = WriteState { wanted, need, targets, stored: 0, failed, finished: false };
        if (targets.count_ones() as usize) < need {
            state.finished = true;
            return (state, WriteStep::Failed { stored: 0, failed });
        }
        if targets == 0 {
            state.finished = true;
            return (state, WriteStep::Done { degraded: wanted });
        }
        (state, WriteStep::Wait)
    }

    /// Splits to send (data first is the driver's job: it sends `targets & data_mask` before
    /// encoding).
    pub fn targets(&self) -> SplitMask {
        self.targets
    }

    pub fn pending(&self) -> SplitMask {
        self.targets & !(self.stored | self.failed)
    }

    /// Splits sent that answered without being stored (their slab failed or refused).
    pub fn failed_targets(&self) -> SplitMask {
        self.targets & self.failed
    }

    pub fn stored(&self) -> SplitMask {
        self.stored
    }

    pub fn on_ack(&mut self, split: usize, stored: bool) -> WriteStep {
        let bit = 1u32 << split;
        if self.finished || self.targets & bit == 0 || (self.stored | self.failed) & bit != 0 {
            return WriteStep::Wait;
        }
        if stored {
            self.stored |= bit;
        } else {
            self.failed |= bit;
        }
        let possible = (self.stored | self.pending()).count_ones() as usize;
        if possible < self.need {
            self.finished = true;
            return WriteStep::Failed { stored: self.stored, failed: self.failed };
        }
        if self.pending() == 0 {
            self.finished = true;
            return WriteStep::Done { degraded: self.wanted & !self.stored };
        }
        WriteStep::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };

    #[test]
    fn read_asks_data_first_plus_delta() {
        let (_, step) = ReadState::start(EC82, 3, 0, 1);
        assert_eq!(step, ReadStep::Ask(0b01_1111_1111));
    }

    #[test]
    fn read_done_without_decode_when_data_splits_arrive_first() {
        let (mut read, _) = ReadState::start(EC82, 3, 0, 1);
        for split in 0..7 {
            assert_eq!(read.on_reply(split, SplitOutcome::Valid { version: 3 }), ReadStep::Wait);
        }
        let step = read.on_reply(7, SplitOutcome::Valid { version: 3 });
        assert_eq!(step, ReadStep::Done { present: 0xff, needs_decode: false, version: 3 });
        // The late parity is dropped.
        assert_eq!(read.on_reply(8, SplitOutcome::Valid { version: 3 }), ReadStep::Wait);
    }

    #[test]
    fn corrupt_split_is_an_erasure_and_asks_another() {
        let (mut read, _) = ReadState::start(EC82, 3, 0, 0);
        assert_eq!(read.on_reply(2, SplitOutcome::Corrupt), ReadStep::Ask(1 << 8));
        for split in [0, 1, 3, 4, 5, 6, 7] {
            assert_eq!(read.on_reply(split, SplitOutcome::Valid { version: 3 }), ReadStep::Wait);
        }
        let step = read.on_reply(8, SplitOutcome::Valid { version: 3 });
        assert_eq!(step, ReadStep::Done { present: 0x1fb, needs_decode: true, version: 3 });
    }

    #[test]
    fn a_late_data_split_is_not_missing_and_a_failed_unavailable_or_stale_one_is() {
        // Parity 8 answers before data split 7, which is still coming: decoded, nothing missing.
        let (mut read, _) = ReadState::start(EC82, 3, 0, 1);
        for split in [0, 1, 2, 3, 4, 5, 6] {
            read.on_reply(split, SplitOutcome::Valid { version: 3 });
        }
        let step = read.on_reply(8, SplitOutcome::Valid { version: 3 });
        assert_eq!(step, ReadStep::Done { present: 0x17f, needs_decode: true, version: 3 });
        assert_eq!(read.missing_data_splits(0x17f), 0);
        // Data split 7 answered corrupt, or of another version: missing.
        for outcome in [SplitOutcome::Corrupt, SplitOutcome::Valid { version: 2 }] {
            let (mut read, _) = ReadState::start(EC82, 3, 0, 1);
            read.on_reply(7, outcome);
            for split in [0, 1, 2, 3, 4, 5, 6] {
                read.on_reply(split, SplitOutcome::Valid { version: 3 });
            }
            assert!(matches!(read.on_reply(8, SplitOutcome::Valid { version: 3 }), ReadStep::Done { .. }));
            assert_eq!(read.missing_data_splits(0x17f), 1 << 7);
        }
        // Data split 2's slab is down: never asked, missing.
        let (mut read, _) = ReadState::start(EC82, 3, 1 << 2, 1);
        for split in [0, 1, 3, 4, 5, 6, 7] {
            read.on_reply(split, SplitOutcome::Valid { version: 3 });
        }
        assert!(matches!(read.on_reply(8, SplitOutcome::Valid { version: 3 }), ReadStep::Done { .. }));
        assert_eq!(read.missing_data_splits(0x1fb), 1 << 2);
    }

    #[test]
    fn stale_version_is_never_counted() {
        let (mut read, _) = ReadState::start(EC82, 4, 0, 2);
        for split in 0..8 {
            read.on_reply(split, SplitOutcome::Valid { version: if split == 5 { 3 } else { 4 } });
        }
        assert_eq!(read.valid().count_ones(), 7);
        let step = read.on_reply(8, SplitOutcome::Valid { version: 4 });
        assert_eq!(step, ReadStep::Done { present: 0x1df, needs_decode: true, version: 4 });
    }

    #[test]
    fn three_failures_at_r2_lose_the_page() {
        let (mut read, _) = ReadState::start(EC82, 1, 0, 1);
        assert_eq!(read.on_reply(0, SplitOutcome::Failed), ReadStep::Wait);
        assert_eq!(read.on_reply(1, SplitOutcome::Failed), ReadStep::Ask(1 << 9));
        assert!(matches!(read.on_reply(2, SplitOutcome::Failed), ReadStep::Lost { .. }));
    }

    #[test]
    fn unavailable_slabs_are_never_asked() {
        let (read, step) = ReadState::start(EC82, 1, 0b11, 1);
        assert_eq!(step, ReadStep::Ask(0b11_1111_1100));
        assert_eq!(read.asked() & 0b11, 0);
        let (_, step) = ReadState::start(EC82, 1, 0b111, 1);
        assert!(matches!(step, ReadStep::Lost { .. }));
    }

    #[test]
    fn write_completes_degraded_with_r_failures_and_fails_beyond() {
        let (mut write, _) = WriteState::start(EC82, 0);
        assert_eq!(write.on_ack(9, false), WriteStep::Wait);
        for split in 0..8 {
            assert_eq!(write.on_ack(split, true), WriteStep::Wait);
        }
        assert_eq!(write.on_ack(8, true), WriteStep::Done { degraded: 1 << 9 });

        let (mut write, _) = WriteState::start(EC82, 0b1);
        write.on_ack(1, false);
        assert!(matches!(write.on_ack(2, false), WriteStep::Failed { .. }));
    }

    #[test]
    fn discovery_picks_the_newest_version_with_k_splits() {
        // A torn write: splits 0..6 have version 9, the rest version 8. Neither has 8 valid
        // splits except version... 8 has 4, 9 has 6: lost, never a mix.
        let (mut read, step) = ReadState::discover(EC82, 0);
        assert_eq!(step, ReadStep::Ask(0x3ff));
        for split in 0..10 {
            let version = if split < 6 { 9 } else { 8 };
            let step = read.on_reply(split, SplitOutcome::Valid { version });
            if split < 9 {
                assert_eq!(step, ReadStep::Wait);
            } else {
                assert!(matches!(step, ReadStep::Lost { .. }), "{step:?}");
            }
        }
        // Only parities missed the new version: version 9 has 8 splits and wins.
        let (mut read, _) = ReadState::discover(EC82, 0);
        let mut last = ReadStep::Wait;
        for split in 0..10 {
            let version = if split < 8 { 9 } else { 8 };
            last = read.on_reply(split, SplitOutcome::Valid { version });
        }
        assert_eq!(last, ReadStep::Done { present: 0xff, needs_decode: false, version: 9 });
        // Version 255 wrapped to 1 is newer than 255.
        let (mut read, _) = ReadState::discover(EC82, 0);
        for split in 0..10 {
            let version = if split == 3 { 255 } else { 1 };
            last = read.on_reply(split, SplitOutcome::Valid { version });
        }
        // The verdict keeps the k lowest splits of the winner (data first): 0..=8 without 3.
        assert_eq!(last, ReadStep::Done { present: 0x1f7, needs_decode: true, version: 1 });
        // Never written anywhere: version 0 wins and means zeros.
        let (mut read, _) = ReadState::discover(EC82, 0b1);
        for split in 1..10 {
            last = read.on_reply(split, SplitOutcome::Valid { version: 0 });
        }
        assert!(matches!(last, ReadStep::Done { version: 0, .. }));
    }

    #[test]
    fn data_only_read_asks_the_data_splits_and_never_a_parity() {
        let (mut read, step) = ReadState::start_data_only(EC82, 3, 0);
        assert_eq!(step, ReadStep::Ask(0xff), "k data splits, no extra parity");
        for split in 0..7 {
            assert_eq!(read.on_reply(split, SplitOutcome::Valid { version: 3 }), ReadStep::Wait);
        }
        let step = read.on_reply(7, SplitOutcome::Valid { version: 3 });
        assert_eq!(step, ReadStep::Done { present: 0xff, needs_decode: false, version: 3 });
        // A data split corrupt, failed or of another version: lost at once, no parity asked.
        for outcome in [SplitOutcome::Corrupt, SplitOutcome::Failed, SplitOutcome::Valid { version: 2 }] {
            let (mut read, _) = ReadState::start_data_only(EC82, 3, 0);
            assert!(matches!(read.on_reply(4, outcome), ReadStep::Lost { .. }), "{outcome:?}");
            assert_eq!(read.asked() & !0xff, 0);
        }
        // A data slab down: lost without asking anyone; a parity slab down changes nothing.
        let (_, step) = ReadState::start_data_only(EC82, 3, 1 << 2);
        assert_eq!(step, ReadStep::Lost { valid: 0, failed: 1 << 2 });
        let (_, step) = ReadState::start_data_only(EC82, 3, 1 << 9);
        assert_eq!(step, ReadStep::Ask(0xff));
    }

    #[test]
    fn data_only_write_needs_every_data_split_and_sends_no_parity() {
        let (mut write, step) = WriteState::start_data_only(EC82, 0);
        assert_eq!((write.targets(), step), (0xff, WriteStep::Wait));
        for split in 0..7 {
            assert_eq!(write.on_ack(split, true), WriteStep::Wait);
        }
        assert_eq!(write.on_ack(7, true), WriteStep::Done { degraded: 0 });
        let (mut write, _) = WriteState::start_data_only(EC82, 0);
        assert!(matches!(write.on_ack(3, false), WriteStep::Failed { .. }));
        // A data slab down fails it before anything is sent; a parity slab down does not.
        let (_, step) = WriteState::start_data_only(EC82, 1 << 3);
        assert!(matches!(step, WriteStep::Failed { stored: 0, .. }));
        let (write, step) = WriteState::start_data_only(EC82, 1 << 8);
        assert_eq!((write.targets(), step), (0xff, WriteStep::Wait));
    }

    #[test]
    fn parity_only_write_sends_the_available_parities_and_ends_whatever_was_stored() {
        let (mut write, step) = WriteState::start_parity_only(EC82, 1 << 2);
        assert_eq!((write.targets(), step), (0x300, WriteStep::Wait));
        assert_eq!(write.on_ack(8, false), WriteStep::Wait);
        assert_eq!(write.on_ack(9, true), WriteStep::Done { degraded: 1 << 8 });
        assert_eq!((write.stored(), write.failed_targets()), (1 << 9, 1 << 8));
        // No parity slab takes writes: done at once, nothing to send.
        let (write, step) = WriteState::start_parity_only(EC82, 0x300);
        assert_eq!((write.targets(), step), (0, WriteStep::Done { degraded: 0x300 }));
    }

    #[test]
    fn discovery_tells_which_splits_vouch_for_the_version() {
        let (mut read, _) = ReadState::discover(EC82, 0);
        let mut last = ReadStep::Wait;
        for split in 0..10 {
            // Data splits written alone at 5, parities still at 4: a parity-stale page.
            let version = if split < 8 { 5 } else { 4 };
            last = read.on_reply(split, SplitOutcome::Valid { version });
        }
        assert_eq!(last, ReadStep::Done { present: 0xff, needs_decode: false, version: 5 });
        assert_eq!(read.valid_at(5), 0xff);
        assert_eq!(read.valid_at(4) & EC82.parity_mask(), 0x300);
    }

    proptest! {
        /// Whatever the order and outcome of replies, a read ends Done only with k valid splits
        /// of the expected version, ends Lost only when k can no longer be reached, and asks
        /// each split at most once.
        #[test]
        fn read_state_machine_is_sound(
            k in 1usize..=16, r in 0usize..=4, delta in 0usize..=4,
            outcomes in proptest::collection::vec(0u8..4, 20),
            order_seed in any::<u64>(),
        ) {
            let shape = Shape { data_splits: k, parity_splits: r, extra_reads: delta.min(r) };
            let (mut read, mut step) = ReadState::start(shape, 7, 0, shape.extra_reads);
            let mut asked_total: SplitMask = 0;
            let mut queue: Vec<usize> = Vec::new();
            let mut good = 0u32;
            let mut rng = order_seed;
            loop {
                match step {
                    ReadStep::Ask(mask) => {
                        prop_assert_eq!(mask & asked_total, 0);
                        asked_total |= mask;
                        for split in 0..k + r { if mask & (1 << split) != 0 { queue.push(split); } }
                    }
                    ReadStep::Done { present, .. } => {
                        prop_assert_eq!(present.count_ones() as usize, k);
                        prop_assert_eq!(present & !good, 0);
                        break;
                    }
                    ReadStep::Lost { .. } => break,
                    ReadStep::Wait => {}
                }
                if queue.is_empty() { break; }
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let split = queue.swap_remove((rng >> 33) as usize % queue.len());
                let outcome = match outcomes[split] {
                    0 | 1 => { good |= 1 << split; SplitOutcome::Valid { version: 7 } }
                    2 => SplitOutcome::Corrupt,
                    _ => SplitOutcome::Valid { version: 6 },
                };
                step = read.on_reply(split, outcome);
            }
            let good_total = (0..k + r).filter(|&s| outcomes[s] <= 1).count();
            if good_total >= k {
                prop_assert!(matches!(step, ReadStep::Done { .. }), "a readable page was not read: {:?}", step);
            } else {
                prop_assert!(matches!(step, ReadStep::Lost { .. }), "an unreadable page was not reported lost: {:?}", step);
            }
        }
    }
}
