//! A standby's copy of the region, on both sides: the primary attaches a [`Replica`], copies
//! what its region held at that moment (adaptive bulk copy, MacR III.D) a step at a time while
//! it serves, and mirrors every change from then on; the standby applies changes sent to it
//! (RPC and log modes) to its own region, checking each one.

use std::time::{Duration, Instant};

use super::{
    class_bytes, Backup, Replica, CHUNK_BYTES, CLASS_COUNT, HEADER_FIXED_BYTES, LIVE, SLOT_HEADER_BYTES,
};
use crate::backup::replica::Change;

/// How the sync copies a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Whole chunks where live slots fill at least half of the chunk, slot by slot elsewhere.
    Adaptive,
    /// Always whole chunks.
    Bulk,
    /// Always slot by slot.
    PerItem,
}

impl SyncPolicy {
    pub fn parse(text: &str) -> Option<SyncPolicy> {
        match text {
            "adaptive" => Some(SyncPolicy::Adaptive),
            "bulk" => Some(SyncPolicy::Bulk),
            "per-item" => Some(SyncPolicy::PerItem),
            _ => None,
        }
    }
}

/// Where a sync stands.
pub struct Cursor {
    policy: SyncPolicy,
    next_chunk: u32,
    started: Instant,
    records: u64,
    bulk_chunks: u32,
    item_chunks: u32,
}

/// A sync's outcome, or where it stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncProgress {
    pub chunks_done: u32,
    pub chunks_total: u32,
    pub records: u64,
    pub bulk_chunks: u32,
    pub item_chunks: u32,
    pub elapsed: Duration,
    pub done: bool,
}

impl Backup {
    /// Starts keeping `replica` equal to this region: from now on every change is mirrored,
    /// and [`Backup::sync_step`] copies what the region holds.
    pub fn attach_replica(&mut self, mut replica: Replica, policy: SyncPolicy) {
        // The class bytes of the chunks assigned so far: the standby's header is its own
        // (same chunk count), its class bytes are ours.
        let classes = HEADER_FIXED_BYTES..HEADER_FIXED_BYTES + self.next_chunk as usize;
        replica.write(classes.start as u64, &self.map[classes]);
        self.replica = Some(replica);
        self.sync = Some(Cursor {
            policy,
            next_chunk: 0,
            started: Instant::now(),
            records: 0,
            bulk_chunks: 0,
            item_chunks: 0,
        });
    }

    /// The replica, if attached (to send it heartbeats and progress).
    pub fn replica_mut(&mut self) -> Option<&mut Replica> {
        self.replica.as_mut()
    }

    /// Drops the replica (the standby is gone or was given up).
    pub fn detach_replica(&mut self) -> Option<Replica> {
        self.sync = None;
        self.replica.take()
    }

    /// Returns once every change so far is in the standby's memory (see [`Replica::barrier`]).
    pub fn barrier(&mut self) {
        if let Some(replica) = self.replica.as_mut() {
            replica.barrier();
        }
    }

    /// Copies chunks to the replica for about `budget`. None when no sync runs.
    pub fn sync_step(&mut self, budget: Duration) -> Option<SyncProgress> {
        let started = Instant::now();
        let mut cursor = self.sync.take()?;
        while cursor.next_chunk < self.next_chunk && started.elapsed() < budget {
            self.copy_chunk(&mut cursor);
            cursor.next_chunk += 1;
        }
        let done = cursor.next_chunk >= self.next_chunk;
        if done {
            self.barrier();
        }
        let progress = SyncProgress {
            chunks_done: cursor.next_chunk,
            chunks_total: self.next_chunk,
            records: cursor.records,
            bulk_chunks: cursor.bulk_chunks,
            item_chunks: cursor.item_chunks,
            elapsed: cursor.started.elapsed(),
            done,
        };
        if !done {
            self.sync = Some(cursor);
        }
        Some(progress)
    }

    fn copy_chunk(&mut self, cursor: &mut Cursor) {
        let chunk = cursor.next_chunk;
        let Some(class) = (self.map[HEADER_FIXED_BYTES + chunk as usize] as usize)
            .checked_sub(1)
            .filter(|&class| class < CLASS_COUNT)
        else {
            return;
        };
        let size = class_bytes(class);
        let start = self.chunk_offset(chunk) as usize;
        let live: Vec<usize> = (0..CHUNK_BYTES / size)
            .map(|index| start + index * size)
            .filter(|&at| u32::from_ne_bytes(self.map[at..at + 4].try_into().expect("4 bytes")) == LIVE)
            .collect();
        cursor.records += live.len() as u64;
        let bulk = match cursor.policy {
            SyncPolicy::Bulk => true,
            SyncPolicy::PerItem => false,
            SyncPolicy::Adaptive => live.len() * size * 2 >= CHUNK_BYTES,
        };
        let Some(replica) = self.replica.as_mut() else { return };
        if bulk {
            cursor.bulk_chunks += 1;
            replica.write(start as u64, &self.map[start..start + CHUNK_BYTES]);
            return;
        }
        cursor.item_chunks += 1;
        for at in live {
            let len = u32::from_le_bytes(self.map[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
            let end = at + (SLOT_HEADER_BYTES + len).min(size);
            replica.write(at as u64 + 4, &self.map[at + 4..end]);
            replica.state(at as u64, LIVE);
        }
    }

    /// The standby's side: applies one change the primary sent, after checking that it stays
    /// inside the region's class bytes and chunks (the header's fixed part is the standby's
    /// own) and that a state word is a slot's.
    pub fn apply(&mut self, change: Change) -> Result<(), ApplyError> {
        let length = self.map.len();
        match change {
            Change::Write { offset, bytes } => {
                let at = usize::try_from(offset).map_err(|_| ApplyError::Offset(offset))?;
                let end = at.checked_add(bytes.len()).filter(|&end| end <= length);
                let Some(end) = end.filter(|_| at >= HEADER_FIXED_BYTES) else {
                    return Err(ApplyError::Outside { len: bytes.len(), offset });
                };
                if at < self.header_bytes && end > HEADER_FIXED_BYTES + self.chunk_count as usize {
                    return Err(ApplyError::CrossesHeader { offset });
                }
                self.map[at..end].copy_from_slice(bytes);
                Ok(())
            }
            Change::State { offset, state } => {
                if offset < self.header_bytes as u64 || offset >= length as u64 || !offset.is_multiple_of(128)
                {
                    return Err(ApplyError::NotASlot { offset });
                }
                self.set_state(offset, state);
                Ok(())
            }
        }
    }
}

/// A change from the primary that the standby's region refuses (it would reach outside the
/// class bytes and chunks, or a state word is not a slot's).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("offset {0}")]
    Offset(u64),
    #[error("a write of {len} bytes at {offset} is outside the region")]
    Outside { len: usize, offset: u64 },
    #[error("a write at {offset} crosses the header's end")]
    CrossesHeader { offset: u64 },
    #[error("state word at {offset} is not a slot's")]
    NotASlot { offset: u64 },
}
