//! Rewrites of erasure-coded chunk pages that a kill cannot tear (docs/KV.md "Restarts").
//!
//! A chunk page that holds acknowledged values is written again whenever a set fills one of
//! its free chunks (group commit on the open page; a freed chunk reused). The k+m splits of an
//! EC page cannot be written atomically together: a server killed in the middle leaves some
//! splits of the new version and some of the old, fewer than k of either (at EC(8,2) any cut
//! that leaves 3 to 7 new splits), and every value in the page is lost though no node failed.
//! Replicated pages do not tear this way (every copy is whole, one suffices) and neither does a
//! page of one split. So an EC or EOR chunk page that holds acknowledged values is first written
//! whole to a journal page (one of [`JOURNAL_PAGES`] pages set aside at the start of the EC
//! region, in its first range), an intent (journal slot, page, scheme) is recorded in the state directory's
//! `rewrites` file, and only then is the page written in place; the intent is cleared when that
//! write is done. A restart writes every page an intent names again from its journal page before
//! it serves ([`crate::Cache::recover_rewrites`]). A page's first write (no value in it was
//! acknowledged) goes in place directly.
//!
//! Why the journal copy is always right to restore: an intent is recorded only after its journal
//! write completed, a page has one write in flight at a time, and its intent is cleared before
//! the page's next journal write starts. So a valid intent names the newest bytes the server
//! meant the page to hold, a superset of every value acknowledged in it (acknowledgements wait
//! for the in-place write).
//!
//! The file: [`JOURNAL_PAGES`] entries of 32 bytes, entry i for journal slot i: `seq: u64 |
//! page: u64 | scheme: u8 (0 EC, 1 EOR) | zeros: [u8; 11] | crc: u32`, the crc32c of the first
//! 28 bytes. An entry whose seq is 0 or whose CRC does not hold names nothing. Each entry is
//! written with one `pwrite` into the page cache, which survives the process as the backup
//! region does (not a crash of the host).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use remem_client::PageOp;

use crate::space::{RegionKind, PAGE_BYTES};
use crate::Cache;

/// Pages of the EC region set aside as journal pages: rewrites in flight at once (more wait).
pub const JOURNAL_PAGES: u64 = 16;
const ENTRY_BYTES: usize = 32;

/// A rewrite that may not have reached every split of its page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Intent {
    pub seq: u64,
    pub slot: u32,
    pub page: u64,
    pub eor: bool,
}

/// The `rewrites` file of a state directory.
#[derive(Debug)]
pub struct RewriteLog {
    file: File,
    next_seq: u64,
    /// The file's bytes, for the copy in remote memory (`remem kv --etcd`, `crate::cache::mirror`).
    entries: [u8; LOG_BYTES],
}

/// The file's size: an entry per journal page.
pub const LOG_BYTES: usize = JOURNAL_PAGES as usize * ENTRY_BYTES;

fn encode(seq: u64, page: u64, eor: bool) -> [u8; ENTRY_BYTES] {
    let mut entry = [0u8; ENTRY_BYTES];
    entry[0..8].copy_from_slice(&seq.to_le_bytes());
    entry[8..16].copy_from_slice(&page.to_le_bytes());
    entry[16] = u8::from(eor);
    let crc = crc32c::crc32c(&entry[..28]);
    entry[28..32].copy_from_slice(&crc.to_le_bytes());
    entry
}

/// The intent of an entry's bytes, if they hold one.
fn decode(slot: u32, entry: &[u8]) -> Option<Intent> {
    let field = |range: std::ops::Range<usize>| {
        let mut bytes = [0u8; 8];
        bytes[..range.len()].copy_from_slice(&entry[range]);
        u64::from_le_bytes(bytes)
    };
    let seq = field(0..8);
    let crc = field(28..32) as u32;
    if seq == 0
        || crc != crc32c::crc32c(&entry[..28])
        || entry[16] > 1
        || entry[17..28].iter().any(|&b| b != 0)
    {
        return None;
    }
    Some(Intent { seq, slot, page: field(8..16), eor: entry[16] == 1 })
}

impl RewriteLog {
    /// Opens (or creates, mode 0600) the file and returns the intents it holds.
    pub fn open(path: &Path) -> io::Result<(RewriteLog, Vec<Intent>)> {
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(path)?;
        let want = JOURNAL_PAGES * ENTRY_BYTES as u64;
        let mut bytes = [0u8; LOG_BYTES];
        let length = file.metadata()?.len();
        if length >= want {
            file.read_exact_at(&mut bytes, 0)?;
        } else {
            // A file cut short (or new) holds what it holds; the rest is empty.
            let present = length as usize;
            file.read_exact_at(&mut bytes[..present], 0)?;
            file.set_len(want)?;
        }
        let intents: Vec<Intent> = bytes
            .chunks_exact(ENTRY_BYTES)
            .enumerate()
            .filter_map(|(slot, entry)| decode(slot as u32, entry))
            .collect();
        let next_seq = intents.iter().map(|intent| intent.seq).max().unwrap_or(0) + 1;
        Ok((RewriteLog { file, next_seq, entries: bytes }, intents))
    }

    /// Records that journal slot `slot` holds the new bytes of `page`.
    pub fn record(&mut self, slot: u32, page: u64, eor: bool) -> io::Result<()> {
        assert!(u64::from(slot) < JOURNAL_PAGES);
        let entry = encode(self.next_seq, page, eor);
        self.next_seq += 1;
        self.write_entry(slot, &entry)
    }

    /// Journal slot `slot` names no page any more.
    pub fn clear(&mut self, slot: u32) -> io::Result<()> {
        assert!(u64::from(slot) < JOURNAL_PAGES);
        self.write_entry(slot, &[0u8; ENTRY_BYTES])
    }

    fn write_entry(&mut self, slot: u32, entry: &[u8; ENTRY_BYTES]) -> io::Result<()> {
        let at = slot as usize * ENTRY_BYTES;
        self.entries[at..at + ENTRY_BYTES].copy_from_slice(entry);
        self.file.write_all_at(entry, at as u64)
    }

    /// The file's bytes as they are now.
    pub fn bytes(&self) -> &[u8; LOG_BYTES] {
        &self.entries
    }
}

/// What [`Cache::recover_rewrites`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// Pages written again from their journal copy.
    pub pages: u64,
    /// Intents that could not be carried out (a journal copy beyond the EC region's tolerance,
    /// or an intent naming no page of the region): those pages stay as they are.
    pub failed: u64,
}

impl Cache<remem_client::PollClient> {
    // The one blocking restart path: it runs before the server serves, over the real client
    // (`Client::execute_all`), so it is not part of the `PageClient` the engine runs on.
    /// Before a reopened server serves: writes every page an intent names again from its
    /// journal copy (blocking), clears the intents, and keeps `log` for the rewrites to come.
    pub fn recover_rewrites(&mut self, mut log: RewriteLog, mut intents: Vec<Intent>) -> Recovered {
        let mut recovered = Recovered::default();
        intents.sort_unstable_by_key(|intent| intent.seq);
        let values = self.space.mapped_pages(RegionKind::Ec);
        let mut page_bytes = vec![0u8; PAGE_BYTES];
        for intent in intents {
            let in_region =
                values.is_some_and(|(first, count)| intent.page >= first && intent.page < first + count);
            if !in_region || (intent.eor && self.main_first_page.is_none()) {
                tracing::warn!(?intent, "an intent names no page of the EC region: ignored");
                recovered.failed += 1;
            } else {
                let journal = self.journal_first_page + u64::from(intent.slot);
                let main = intent.eor.then(|| self.main_page(intent.page));
                let client = self.client.client();
                let result = client
                    .execute_all(&mut [PageOp::Read { page: journal, buf: &mut page_bytes }])
                    .and_then(|()| {
                        let mut writes = vec![PageOp::Write { page: intent.page, data: &page_bytes }];
                        if let Some(main) = main {
                            writes.push(PageOp::Write { page: main, data: &page_bytes });
                        }
                        client.execute_all(&mut writes)
                    });
                match result {
                    Ok(()) => recovered.pages += 1,
                    Err(error) => {
                        tracing::warn!(?intent, %error, "a page rewrite cut short could not be completed");
                        recovered.failed += 1;
                    }
                }
            }
            if let Err(error) = log.clear(intent.slot) {
                tracing::error!(%error, "the rewrites file could not clear an intent");
            }
        }
        self.rewrites = Some(log);
        recovered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intents_survive_a_reopen_and_cleared_or_damaged_ones_name_nothing() {
        let dir = std::env::temp_dir().join(format!("remem-rewrites-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rewrites");
        let (mut log, intents) = RewriteLog::open(&path).unwrap();
        assert!(intents.is_empty());
        log.record(3, 1234, false).unwrap();
        log.record(5, 99, true).unwrap();
        log.record(7, 7, false).unwrap();
        log.clear(7).unwrap();
        drop(log);
        // A flipped bit in slot 5's entry: it names nothing.
        let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut byte = [0u8; 1];
        file.read_exact_at(&mut byte, 5 * 32 + 9).unwrap();
        file.write_all_at(&[byte[0] ^ 4], 5 * 32 + 9).unwrap();
        let (mut log, intents) = RewriteLog::open(&path).unwrap();
        assert_eq!(intents, vec![Intent { seq: 1, slot: 3, page: 1234, eor: false }]);
        log.record(4, 5, true).unwrap();
        let (_, intents) = RewriteLog::open(&path).unwrap();
        assert_eq!(
            intents[1],
            Intent { seq: 2, slot: 4, page: 5, eor: true },
            "seqs go on from the newest intent"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn any_bytes_decode_to_an_intent_or_nothing() {
        let mut state = 0x1234_5678_9abc_def0u64;
        for _ in 0..10_000 {
            let mut entry = [0u8; ENTRY_BYTES];
            for byte in entry.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *byte = state as u8;
            }
            assert_eq!(decode(0, &entry), None, "random bytes pass a CRC and zero checks only by chance");
        }
        assert_eq!(decode(2, &encode(9, 42, true)), Some(Intent { seq: 9, slot: 2, page: 42, eor: true }));
    }
}
