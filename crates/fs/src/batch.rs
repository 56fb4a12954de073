//! Many reads and writes at once: the data requests that arrived together (the FUSE side
//! queues those that come while the file system is busy, `crate::combine`) become as few
//! engine batches as their order allows, and each request is answered on its own.
//!
//! Order: the outcome is exactly that of running the requests one at a time in arrival order.
//! The requests are cut into generations; a generation ends before a request that touches a
//! file page an earlier write of the generation touches (a read would miss that write, a
//! partial write's read-modify-write would lose it), before a read of a file an earlier write
//! of the generation grows (it would clip to the old size), and once its read replies reach
//! `GENERATION_BYTES`. A generation is two engine batches: every page read (those of the
//! reads, and the partial first and last pages of the writes), then every page write. Within a
//! generation no request depends on the writes of another, so this order gives the serial
//! outcome. Reads are answered between the two batches.
//!
//! Failures: the engine names each page op that failed, so a failed op fails exactly the
//! request it belongs to (`EIO`) and every other request of the batch completes. A write whose
//! partial-page read failed writes nothing, as it would alone. The journal records of a
//! generation are appended with one `write(2)`; if that fails, the requests that added records
//! fail with it (`EIO`), as each would have alone, and the others keep their outcome.
//!
//! Nothing is allocated per page or per request once the buffers have grown to the largest
//! generation: the read arena, two scratch pages per write, the op list, the plans.

use remem_client::{PageError, PageOp};

use crate::data::{check_end, file_of, note_write, push_allocation, Journal};
use crate::error::{FsError, FsResult};
use crate::extents::{Allocator, ExtentMap, RunSet};
use crate::filesystem::{recycle, FileSystem, MAX_IO_BYTES};
use crate::namespace::{Content, Namespace};
use crate::persist::record::{Record, Run};
use crate::store::PageStore;

/// Read replies of one generation, at most (a single larger read still runs, alone).
pub const GENERATION_BYTES: usize = 4 << 20;

/// A data request from the kernel, its bytes borrowed.
#[derive(Clone, Copy, Debug)]
pub enum DataRequest<'a> {
    Read { inode: u64, offset: u64, size: usize },
    Write { inode: u64, offset: u64, data: &'a [u8] },
}

/// What a data request returns: the bytes read, or how many were written.
#[derive(Debug, PartialEq, Eq)]
pub enum DataAnswer<'a> {
    Read(&'a [u8]),
    Written(u32),
}

/// A request's part in the generation being run.
#[derive(Debug)]
pub(crate) enum Plan {
    /// Answered while planning: an error found before any I/O, or nothing to do.
    Answered,
    /// Its reply is `arena[start..start + len]`.
    Read {
        start: usize,
        len: usize,
        error: Option<PageError>,
    },
    Write(WritePlan),
}

#[derive(Debug)]
pub(crate) struct WritePlan {
    inode: u64,
    end: u64,
    first_page: u64,
    last_page: u64,
    /// Where the write begins in its first page.
    head_offset: usize,
    head_partial: bool,
    tail_partial: bool,
    /// Its two scratch pages are `scratch[2 * slot * page .. 2 * (slot + 1) * page]`.
    slot: usize,
    /// It added journal records (a journal that fails fails it).
    journaled: bool,
    error: Option<FsError>,
}

/// The reusable buffers of the batch path (kept in `FileSystem`).
#[derive(Debug, Default)]
pub(crate) struct BatchBuffers {
    pub(crate) plans: Vec<Plan>,
    /// The request (index in the generation) of each page op of the batch running.
    pub(crate) op_owner: Vec<usize>,
    /// The writes of the generation being formed: (inode, first page, end page, end byte).
    pub(crate) writes: Vec<(u64, u64, u64, u64)>,
    /// The runs a write maps.
    pub(crate) new_runs: Vec<Run>,
}

/// The file pages `offset..offset + len` touch, as `first..end`; empty when there are none or
/// the range is invalid (such a request fails on its own, touching nothing).
fn page_range(offset: u64, len: usize, page_bytes: u64) -> (u64, u64) {
    match offset.checked_add(len as u64) {
        Some(end) if len > 0 => (offset / page_bytes, (end - 1) / page_bytes + 1),
        _ => (0, 0),
    }
}

/// The extent map of a file the generation already planned for.
fn extents_of(namespace: &Namespace, inode: u64) -> &ExtentMap {
    match namespace.get(inode).map(|entry| &entry.content) {
        Ok(Content::File(extents)) => extents,
        _ => unreachable!("inode {inode} was planned as a file, under the same lock"),
    }
}

impl<S: PageStore> FileSystem<S> {
    /// Runs `requests` (in arrival order) with the outcome of running them one at a time, and
    /// calls `answer(index, result)` exactly once per request, in no particular order.
    pub fn run_data_requests(
        &mut self,
        requests: &[DataRequest<'_>],
        answer: &mut dyn FnMut(usize, FsResult<DataAnswer<'_>>),
    ) {
        let mut start = 0;
        while start < requests.len() {
            let (len, arena_bytes, writes) = self.next_generation(&requests[start..]);
            let generation = &requests[start..start + len];
            self.run_generation(generation, arena_bytes, writes, &mut |index, result| {
                answer(start + index, result)
            });
            start += len;
        }
    }

    /// How many requests from the start of `requests` form the next generation (at least
    /// one), with the arena bytes and the writes it needs.
    fn next_generation(&mut self, requests: &[DataRequest<'_>]) -> (usize, usize, usize) {
        let page_bytes = self.page_bytes as u64;
        let writes = &mut self.batch.writes;
        writes.clear();
        let mut arena_bytes = 0;
        for (index, request) in requests.iter().enumerate() {
            let (inode, offset, len, is_read) = match *request {
                DataRequest::Read { inode, offset, size } => (inode, offset, size, true),
                DataRequest::Write { inode, offset, data } => (inode, offset, data.len(), false),
            };
            let size_bytes = self.namespace.get(inode).map_or(0, |entry| entry.attributes.size_bytes);
            let (first, end) = page_range(offset, len, page_bytes);
            let conflicts = writes.iter().any(|&(other, other_first, other_end, other_end_byte)| {
                other == inode
                    && ((first < other_end && other_first < end) || (is_read && other_end_byte > size_bytes))
            });
            let span = if is_read && len <= MAX_IO_BYTES && offset < size_bytes {
                let (first, end) = page_range(offset, len.min((size_bytes - offset) as usize), page_bytes);
                ((end - first) * page_bytes) as usize
            } else {
                0
            };
            if index > 0 && (conflicts || arena_bytes + span > GENERATION_BYTES) {
                return (index, arena_bytes, writes.len());
            }
            arena_bytes += span;
            if !is_read {
                writes.push((inode, first, end, offset.saturating_add(len as u64)));
            }
        }
        (requests.len(), arena_bytes, writes.len())
    }

    /// Runs one generation (see the module docs): plan and read, answer the reads, write,
    /// journal, answer the writes.
    fn run_generation(
        &mut self,
        requests: &[DataRequest<'_>],
        arena_bytes: usize,
        writes: usize,
        answer: &mut dyn FnMut(usize, FsResult<DataAnswer<'_>>),
    ) {
        if self.arena.len() < arena_bytes {
            self.arena.resize(arena_bytes, 0);
        }
        let scratch_bytes = (2 * self.page_bytes * writes).max(self.scratch.len());
        self.scratch.resize(scratch_bytes, 0);
        self.plan_and_read(requests, arena_bytes, answer);
        let FileSystem { arena, batch, .. } = &mut *self;
        for (index, plan) in batch.plans.iter_mut().enumerate() {
            if let Plan::Read { start, len, error } = plan {
                match error.take() {
                    Some(error) => answer(index, Err(error.into())),
                    None => answer(index, Ok(DataAnswer::Read(&arena[*start..*start + *len]))),
                }
            }
        }
        self.write_planned_pages(requests);
        self.note_writes();
        let journal = self.commit(Ok(())).err().map(|error| error.to_string());
        for (index, plan) in self.batch.plans.drain(..).enumerate() {
            let (Plan::Write(write), DataRequest::Write { data, .. }) = (plan, &requests[index]) else {
                continue;
            };
            let result = match (write.error, &journal) {
                (_, Some(journal)) if write.journaled => Err(FsError::Journal(journal.clone())),
                (Some(error), _) => Err(error),
                (None, _) => Ok(DataAnswer::Written(data.len() as u32)),
            };
            answer(index, result);
        }
    }

    /// Plans every request of the generation (errors and empty requests are answered here),
    /// then runs the first engine batch: the pages of the reads, and the partial pages of the
    /// writes.
    fn plan_and_read(
        &mut self,
        requests: &[DataRequest<'_>],
        arena_bytes: usize,
        answer: &mut dyn FnMut(usize, FsResult<DataAnswer<'_>>),
    ) {
        let page_len = self.page_bytes;
        let FileSystem {
            namespace,
            store,
            allocator,
            arena,
            scratch,
            spare_ops,
            unwritten,
            pending,
            batch,
            ..
        } = &mut *self;
        let mut ops = recycle(std::mem::take(spare_ops));
        batch.plans.clear();
        batch.op_owner.clear();
        let mut arena_rest = &mut arena[..arena_bytes];
        let mut arena_at = 0;
        let mut scratch_pages = scratch.chunks_exact_mut(page_len);
        let mut slot = 0;
        for (index, request) in requests.iter().enumerate() {
            let planned = match *request {
                DataRequest::Read { inode, offset, size } => {
                    plan_read(namespace, inode, offset, size, page_len as u64).map(|read| {
                        read.map(|(first_page, pages, start, len)| {
                            let span = pages as usize * page_len;
                            let (chunk, rest) = std::mem::take(&mut arena_rest).split_at_mut(span);
                            arena_rest = rest;
                            let extents = extents_of(namespace, inode);
                            for (page, buf) in (first_page..).zip(chunk.chunks_exact_mut(page_len)) {
                                match extents.lookup(page) {
                                    Some(remote) => ops.push(PageOp::Read { page: remote, buf }),
                                    None => buf.fill(0),
                                }
                            }
                            arena_at += span;
                            Plan::Read { start: arena_at - span + start, len, error: None }
                        })
                    })
                }
                DataRequest::Write { inode, offset, data } => {
                    let metadata = Metadata {
                        namespace: &mut *namespace,
                        allocator: &mut *allocator,
                        pending: &mut *pending,
                        unwritten: &mut *unwritten,
                        new_runs: &mut batch.new_runs,
                    };
                    metadata.plan_write(inode, offset, data, page_len as u64, slot).map(|write| {
                        write.map(|(write, head_remote, tail_remote)| {
                            let head = scratch_pages.next().expect("two scratch pages per write");
                            let tail = scratch_pages.next().expect("two scratch pages per write");
                            slot += 1;
                            // Read-modify-write: the partial pages that held data are read
                            // first; fresh ones are zeros.
                            for (partial, remote, buf) in [
                                (write.head_partial, head_remote, head),
                                (write.tail_partial, tail_remote, tail),
                            ] {
                                match (partial, remote) {
                                    (true, Some(remote)) => ops.push(PageOp::Read { page: remote, buf }),
                                    (true, None) => buf.fill(0),
                                    (false, _) => {}
                                }
                            }
                            Plan::Write(write)
                        })
                    })
                }
            };
            let plan = match planned {
                Ok(Some(plan)) => plan,
                Ok(None) if matches!(request, DataRequest::Read { .. }) => {
                    answer(index, Ok(DataAnswer::Read(&[])));
                    Plan::Answered
                }
                Ok(None) => {
                    answer(index, Ok(DataAnswer::Written(0)));
                    Plan::Answered
                }
                Err(error) => {
                    answer(index, Err(error));
                    Plan::Answered
                }
            };
            batch.op_owner.resize(ops.len(), index);
            batch.plans.push(plan);
        }
        let BatchBuffers { plans, op_owner, .. } = batch;
        if !ops.is_empty() {
            store.execute_each(&mut ops, &mut |op, error| match &mut plans[op_owner[op]] {
                Plan::Read { error: slot @ None, .. } => *slot = Some(error),
                Plan::Write(WritePlan { error: slot @ None, .. }) => *slot = Some(error.into()),
                _ => {}
            });
        }
        *spare_ops = recycle(ops);
    }

    /// The second engine batch: the pages of every write whose partial pages were read, the
    /// partial ones patched with the new bytes.
    fn write_planned_pages(&mut self, requests: &[DataRequest<'_>]) {
        let page_len = self.page_bytes;
        let page_bytes = page_len as u64;
        let FileSystem { namespace, store, scratch, spare_ops, batch, .. } = &mut *self;
        for (plan, request) in batch.plans.iter().zip(requests) {
            let (Plan::Write(write @ WritePlan { error: None, .. }), DataRequest::Write { data, .. }) =
                (plan, request)
            else {
                continue;
            };
            let (head, tail) = scratch[2 * write.slot * page_len..][..2 * page_len].split_at_mut(page_len);
            if write.head_partial {
                let len = (page_len - write.head_offset).min(data.len());
                head[write.head_offset..write.head_offset + len].copy_from_slice(&data[..len]);
            }
            if write.tail_partial {
                let len = (write.end % page_bytes) as usize;
                tail[..len].copy_from_slice(&data[data.len() - len..]);
            }
        }
        let mut ops = recycle(std::mem::take(spare_ops));
        batch.op_owner.clear();
        for (index, (plan, request)) in batch.plans.iter().zip(requests).enumerate() {
            let (
                Plan::Write(write @ WritePlan { error: None, .. }),
                &DataRequest::Write { offset, data, .. },
            ) = (plan, request)
            else {
                continue;
            };
            let (head, tail) = scratch[2 * write.slot * page_len..][..2 * page_len].split_at(page_len);
            let extents = extents_of(namespace, write.inode);
            for page in write.first_page..=write.last_page {
                let remote = extents.lookup(page).expect("mapped when planned, under the same lock");
                let bytes: &[u8] = if page == write.first_page && write.head_partial {
                    head
                } else if page == write.last_page && write.tail_partial {
                    tail
                } else {
                    let start = (page * page_bytes - offset) as usize;
                    &data[start..start + page_len]
                };
                ops.push(PageOp::Write { page: remote, data: bytes });
                batch.op_owner.push(index);
            }
        }
        let BatchBuffers { plans, op_owner, .. } = batch;
        if !ops.is_empty() {
            store.execute_each(&mut ops, &mut |op, error| {
                if let Plan::Write(WritePlan { error: slot @ None, .. }) = &mut plans[op_owner[op]] {
                    *slot = Some(error.into());
                }
            });
        }
        *spare_ops = recycle(ops);
    }

    /// After the writes' pages are stored: each file's size and times, and the journal
    /// records that says so.
    fn note_writes(&mut self) {
        let FileSystem { namespace, pending, unwritten, dirty_times, batch, .. } = &mut *self;
        for plan in &mut batch.plans {
            let Plan::Write(write @ WritePlan { error: None, .. }) = plan else { continue };
            let entry = namespace.get_mut(write.inode).expect("planned under the same lock");
            let (attributes, extents) = file_of(entry).expect("planned as a file");
            let before = pending.len();
            let journal = Journal { pending, unwritten, dirty_times };
            note_write(
                journal,
                write.inode,
                attributes,
                extents,
                (write.first_page, write.last_page + 1),
                write.end,
            );
            write.journaled |= pending.len() > before;
        }
    }
}

/// A read's pages: (first page, page count, start in the first page, length), or `None` when
/// it reads nothing (at or past the end, or zero bytes).
fn plan_read(
    namespace: &Namespace,
    inode: u64,
    offset: u64,
    size: usize,
    page_bytes: u64,
) -> FsResult<Option<(u64, u64, usize, usize)>> {
    if size > MAX_IO_BYTES {
        return Err(FsError::Invalid("read larger than the FUSE maximum"));
    }
    let entry = namespace.get(inode)?;
    match entry.content {
        Content::File(_) => {}
        Content::Directory(_) => return Err(FsError::IsDirectory),
        Content::Symlink(_) | Content::Special { .. } => return Err(FsError::Invalid("not a regular file")),
    }
    let size_bytes = entry.attributes.size_bytes;
    if offset >= size_bytes || size == 0 {
        return Ok(None);
    }
    // offset < size <= MAX_FILE_BYTES and size <= 16 MiB: no overflow.
    let end = size_bytes.min(offset + size as u64);
    let first_page = offset / page_bytes;
    let pages = (end - 1) / page_bytes - first_page + 1;
    Ok(Some((first_page, pages, (offset - first_page * page_bytes) as usize, (end - offset) as usize)))
}

/// A write's plan, and the remem pages of its partial first and last pages if they held data.
type PlannedWrite = (WritePlan, Option<u64>, Option<u64>);

/// The metadata a write's planning changes: its new pages and their records.
struct Metadata<'a> {
    namespace: &'a mut Namespace,
    allocator: &'a mut Allocator,
    pending: &'a mut Vec<Record>,
    unwritten: &'a mut RunSet,
    new_runs: &'a mut Vec<Run>,
}

impl Metadata<'_> {
    /// Checks a write and maps its pages (journaled even if the write fails later: the pages
    /// are the file's from now on). Returns its plan and the remem pages of its partial first
    /// and last pages if they held data, or `None` for an empty write.
    fn plan_write(
        self,
        inode: u64,
        offset: u64,
        data: &[u8],
        page_bytes: u64,
        slot: usize,
    ) -> FsResult<Option<PlannedWrite>> {
        if data.len() > MAX_IO_BYTES {
            return Err(FsError::Invalid("write larger than the FUSE maximum"));
        }
        let end = check_end(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(None);
        }
        let (attributes, extents) = file_of(self.namespace.get_mut(inode)?)?;
        let first_page = offset / page_bytes;
        let last_page = (end - 1) / page_bytes;
        let head_offset = (offset % page_bytes) as usize;
        let head_partial = head_offset != 0 || end - first_page * page_bytes < page_bytes;
        let tail_partial = last_page != first_page && end % page_bytes != 0;
        let head_remote = if head_partial { extents.lookup(first_page) } else { None };
        let tail_remote = if tail_partial { extents.lookup(last_page) } else { None };
        let new_runs = self.new_runs;
        new_runs.clear();
        extents.map_range(first_page, last_page + 1, self.allocator, |file_page, remote, len| {
            new_runs.push(Run { file_page, remote, len })
        })?;
        attributes.mapped_pages = extents.mapped_pages();
        let journaled = !new_runs.is_empty();
        if journaled {
            push_allocation(self.pending, self.unwritten, inode, new_runs, attributes.size_bytes, None);
        }
        let write = WritePlan {
            inode,
            end,
            first_page,
            last_page,
            head_offset,
            head_partial,
            tail_partial,
            slot,
            journaled,
            error: None,
        };
        Ok(Some((write, head_remote, tail_remote)))
    }
}
