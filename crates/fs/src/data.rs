//! The data path: read, write, truncate and fallocate over a file's extent map and the page
//! store. Reads and writes run through `crate::batch` (many at once, or one).
//!
//! Invariants: a file page without a remem page reads as zeros and costs no I/O; the bytes of a
//! mapped page beyond the file's size are zeros (truncate and hole punching zero what they cut
//! from a page), so a write that only partly covers a page reads the page, patches it and
//! writes it back (read-modify-write) without ever exposing old bytes; a page freshly mapped is
//! not read at all. Per request nothing is allocated once the buffers have grown to the
//! largest batch (see `crate::batch`).
//!
//! Journal records (see `crate::persist`): an overwrite of pages already written changes only
//! times, which are kept lazily (`dirty_times`), so it appends nothing; a write that grows the
//! file, maps new pages or writes fallocated ones appends one `Write` record (and `Allocate`
//! records for the new pages), in one `write(2)`, before it returns. Truncate, hole punching
//! and fallocate append theirs the same way.

use std::collections::BTreeSet;
use std::time::SystemTime;

use remem_client::PageOp;

use crate::batch::{DataAnswer, DataRequest};
use crate::error::{FsError, FsResult};
use crate::extents::{ExtentMap, RunSet};
use crate::filesystem::{FileSystem, MAX_FILE_BYTES};
use crate::namespace::{Attributes, Content, Inode};
use crate::persist::record::{Record, Run};
use crate::store::PageStore;

/// The file of `entry`, or the errno a data operation on something else gets.
pub(crate) fn file_of(entry: &mut Inode) -> FsResult<(&mut Attributes, &mut ExtentMap)> {
    match &mut entry.content {
        Content::File(extents) => Ok((&mut entry.attributes, extents)),
        Content::Directory(_) => Err(FsError::IsDirectory),
        Content::Symlink(_) | Content::Special { .. } => Err(FsError::Invalid("not a regular file")),
    }
}

pub(crate) fn check_end(offset: u64, len: u64) -> FsResult<u64> {
    offset.checked_add(len).filter(|&end| end <= MAX_FILE_BYTES).ok_or(FsError::TooLarge {
        offset,
        len,
        max: MAX_FILE_BYTES,
    })
}

/// Zeroes bytes `from..to` of the remem page `remote` (read, patch, write).
fn zero_in_page<S: PageStore>(
    store: &mut S,
    page_buffer: &mut [u8],
    remote: u64,
    from: usize,
    to: usize,
) -> FsResult<()> {
    store.execute_all(&mut [PageOp::Read { page: remote, buf: page_buffer }])?;
    page_buffer[from..to].fill(0);
    store.execute_all(&mut [PageOp::Write { page: remote, data: page_buffer }])?;
    Ok(())
}

impl<S: PageStore> FileSystem<S> {
    /// Reads up to `size` bytes at `offset`, clipped to the file's size (a batch of one,
    /// `crate::batch`).
    pub fn read(&mut self, inode: u64, offset: u64, size: usize) -> FsResult<&[u8]> {
        let mut outcome = None;
        self.run_data_requests(&[DataRequest::Read { inode, offset, size }], &mut |_, result| {
            outcome = Some(result.map(|answer| match answer {
                DataAnswer::Read(bytes) => bytes.len(),
                DataAnswer::Written(_) => unreachable!("a read is answered with bytes"),
            }));
        });
        let len = outcome.expect("every request is answered")?;
        // The only read of its batch: its pages begin the arena.
        let start = if len == 0 { 0 } else { (offset % self.page_bytes as u64) as usize };
        Ok(&self.arena[start..start + len])
    }

    /// Writes `data` at `offset`, allocating pages where the file has none. Returns the bytes
    /// written (all of them, or an error). A batch of one (`crate::batch`).
    pub fn write(&mut self, inode: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let mut outcome = None;
        self.run_data_requests(&[DataRequest::Write { inode, offset, data }], &mut |_, result| {
            outcome = Some(result.map(|answer| match answer {
                DataAnswer::Written(written) => written,
                DataAnswer::Read(_) => unreachable!("a write is answered with a count"),
            }));
        });
        outcome.expect("every request is answered")
    }

    /// Sets a file's size: shrinking frees whole pages past the end and zeroes the cut part of
    /// the last page; growing allocates nothing (the new bytes read as zeros).
    pub fn truncate(&mut self, inode: u64, size_bytes: u64) -> FsResult<()> {
        let result = self.truncate_pages(inode, size_bytes);
        self.commit(result)
    }

    fn truncate_pages(&mut self, inode: u64, size_bytes: u64) -> FsResult<()> {
        check_end(size_bytes, 0)?;
        let page_bytes = self.page_bytes as u64;
        let mut runs = Vec::new();
        {
            let FileSystem { namespace, store, scratch, .. } = &mut *self;
            let (attributes, extents) = file_of(namespace.get_mut(inode)?)?;
            if size_bytes < attributes.size_bytes {
                let cut = (size_bytes % page_bytes) as usize;
                if cut != 0 {
                    if let Some(remote) = extents.lookup(size_bytes / page_bytes) {
                        let page_buffer = &mut scratch[..page_bytes as usize];
                        zero_in_page(store, page_buffer, remote, cut, page_bytes as usize)?;
                    }
                }
            }
            // Whatever the old size: pages past the new end go, those fallocated past the old
            // end with FALLOC_FL_KEEP_SIZE too (as Linux file systems drop blocks past EOF on
            // truncate). The journal's replay of this record does exactly this.
            extents.unmap_range(size_bytes.div_ceil(page_bytes), u64::MAX, |remote, len| {
                runs.push((remote, len))
            });
            attributes.mapped_pages = extents.mapped_pages();
            let now = SystemTime::now();
            attributes.size_bytes = size_bytes;
            attributes.mtime = now;
            attributes.ctime = now;
            self.pending.push(Record::Truncate { inode, size_bytes, time: now });
        }
        self.release_runs(&runs)
    }

    /// Makes `offset..end` read as zeros: whole pages lose their remem page, the partial pages
    /// at the ends are zeroed in place.
    fn zero_range(&mut self, inode: u64, offset: u64, end: u64) -> FsResult<()> {
        let page_bytes = self.page_bytes as u64;
        let mut runs = Vec::new();
        {
            let FileSystem { namespace, store, scratch, .. } = &mut *self;
            let (attributes, extents) = file_of(namespace.get_mut(inode)?)?;
            let first_whole = offset.div_ceil(page_bytes);
            let end_whole = end / page_bytes;
            let now = SystemTime::now();
            // Queued first: a partial page zeroed below changes nothing the journal knows, and
            // the unmap after it cannot fail.
            let (punch_first, punch_end) =
                if first_whole < end_whole { (first_whole, end_whole) } else { (0, 0) };
            let page_buffer = &mut scratch[..page_bytes as usize];
            if first_whole > end_whole {
                // Inside one page.
                if let Some(remote) = extents.lookup(offset / page_bytes) {
                    let base = offset / page_bytes * page_bytes;
                    zero_in_page(
                        store,
                        page_buffer,
                        remote,
                        (offset - base) as usize,
                        (end - base) as usize,
                    )?;
                }
            } else {
                if !offset.is_multiple_of(page_bytes) {
                    if let Some(remote) = extents.lookup(offset / page_bytes) {
                        let from = (offset % page_bytes) as usize;
                        zero_in_page(store, page_buffer, remote, from, page_bytes as usize)?;
                    }
                }
                if !end.is_multiple_of(page_bytes) {
                    if let Some(remote) = extents.lookup(end_whole) {
                        zero_in_page(store, page_buffer, remote, 0, (end % page_bytes) as usize)?;
                    }
                }
                extents.unmap_range(first_whole, end_whole, |remote, len| runs.push((remote, len)));
            }
            attributes.mapped_pages = extents.mapped_pages();
            attributes.mtime = now;
            attributes.ctime = now;
            self.pending.push(Record::Punch {
                inode,
                first_page: punch_first,
                end_page: punch_end,
                time: now,
            });
        }
        self.release_runs(&runs)
    }

    /// fallocate(2): mode 0 and `FALLOC_FL_KEEP_SIZE` allocate, `FALLOC_FL_PUNCH_HOLE` (with
    /// KEEP_SIZE, as Linux requires) frees, `FALLOC_FL_ZERO_RANGE` zeroes and allocates.
    pub fn fallocate(&mut self, inode: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        let result = self.fallocate_pages(inode, offset, length, mode);
        self.commit(result)
    }

    fn fallocate_pages(&mut self, inode: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        const KNOWN: i32 =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !KNOWN != 0 {
            return Err(FsError::Unsupported("fallocate mode"));
        }
        if length == 0 {
            return Err(FsError::Invalid("fallocate of zero bytes"));
        }
        let end = check_end(offset, length)?;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
        if punch && (!keep_size || zero) {
            return Err(FsError::Unsupported("PUNCH_HOLE without KEEP_SIZE, or with ZERO_RANGE"));
        }
        if punch || zero {
            self.zero_range(inode, offset, end)?;
            if punch {
                return Ok(());
            }
        }
        let page_bytes = self.page_bytes as u64;
        let FileSystem { namespace, allocator, pending, unwritten, .. } = self;
        let (attributes, extents) = file_of(namespace.get_mut(inode)?)?;
        let mut new_runs = Vec::new();
        extents.map_range(
            offset / page_bytes,
            end.div_ceil(page_bytes),
            allocator,
            |file_page, remote, len| new_runs.push(Run { file_page, remote, len }),
        )?;
        attributes.mapped_pages = extents.mapped_pages();
        let mut time = None;
        if !keep_size && end > attributes.size_bytes {
            attributes.size_bytes = end;
            let now = SystemTime::now();
            attributes.mtime = now;
            attributes.ctime = now;
            time = Some(now);
        }
        if !new_runs.is_empty() || time.is_some() {
            push_allocation(pending, unwritten, inode, &new_runs, attributes.size_bytes, time);
        }
        Ok(())
    }
}
/// The journal state a write updates: records to persist, pages allocated but never written,
/// inodes whose times changed with nothing else to journal.
pub(crate) struct Journal<'a> {
    pub(crate) pending: &'a mut Vec<Record>,
    pub(crate) unwritten: &'a mut RunSet,
    pub(crate) dirty_times: &'a mut BTreeSet<u64>,
}

/// After a write's pages are stored: the file's size and times, and what the journal must say
/// (a size change or first writes of allocated pages are records; times alone are batched).
pub(crate) fn note_write(
    journal: Journal<'_>,
    inode: u64,
    attributes: &mut Attributes,
    extents: &ExtentMap,
    (first_page, end_page): (u64, u64),
    end: u64,
) {
    let Journal { pending, unwritten, dirty_times } = journal;
    let now = SystemTime::now();
    let grew = end > attributes.size_bytes;
    attributes.size_bytes = attributes.size_bytes.max(end);
    attributes.mtime = now;
    attributes.ctime = now;
    let mut touched_unwritten = false;
    if !unwritten.is_empty() {
        extents.for_each_run_in(first_page, end_page, |_, remote, len| {
            touched_unwritten |= unwritten.remove(remote, len);
        });
    }
    if grew || touched_unwritten {
        pending.push(Record::Write {
            inode,
            size_bytes: attributes.size_bytes,
            time: now,
            first_page,
            end_page,
        });
    } else {
        dirty_times.insert(inode);
    }
}

/// Queues `Allocate` records for new runs of `inode` (at most `MAX_RUNS_PER_RECORD` runs
/// each; the last carries `size_bytes` and `time`) and makes the runs unwritten pages.
pub(crate) fn push_allocation(
    pending: &mut Vec<Record>,
    unwritten: &mut crate::extents::RunSet,
    inode: u64,
    runs: &[Run],
    size_bytes: u64,
    time: Option<SystemTime>,
) {
    for run in runs {
        unwritten.insert(run.remote, run.len);
    }
    let mut chunks = runs.chunks(crate::persist::record::MAX_RUNS_PER_RECORD).peekable();
    if chunks.peek().is_none() {
        pending.push(Record::Allocate { inode, runs: Vec::new(), size_bytes, time });
    }
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        pending.push(Record::Allocate {
            inode,
            runs: chunk.to_vec(),
            size_bytes,
            time: if last { time } else { None },
        });
    }
}
