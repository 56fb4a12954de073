//! The transmission phase of one connection: requests in, page operations on the store, replies
//! out.
//!
//! Batching. The connection reads whatever its socket holds, parses every complete request in
//! it, and runs them as one batch: one `execute` call on the store, so up to the client's
//! in-flight limit of pages travel at once, with replies written when the batch is done (in
//! request order; handles make any order legal). Requests a client pipelines (qemu, fio at
//! queue depth 32, the kernel) thus share round trips without a thread hand-off.
//!
//! Ordering inside a batch. The store runs ops on one page in batch order, so reads and whole
//! page writes may share a batch freely. Two cases need care, and get their own batch:
//! - read-modify-write: a write that covers part of a page reads that page first (phase 1) and
//!   writes the patched page with the others (phase 2). If an earlier write of the batch
//!   touches the same page, phase 1 would read it too early, so the batch ends before it;
//! - discards (TRIM, WRITE_ZEROES) happen between `execute` calls, so those commands, FLUSH
//!   and DISC are barriers: they run alone, after every earlier request is answered.
//!
//! Bounds. A request's payload is at most `max_request_bytes` (32 MiB: a larger WRITE is a hard
//! disconnect, as the spec allows; a larger READ is `EINVAL`). A batch holds at most
//! `max_batch_requests` requests and about `max_batch_pages` pages, so the input buffer, the
//! read arena and the reply buffer each stay below one batch. The buffers, the op list and the
//! bookkeeping vectors are reused: a connection allocates nothing per request once warm
//! (error replies aside).
//!
//! Fault model: a failed page makes its request fail with the error of [`crate::error`]; the
//! connection lives on. A protocol violation (bad magic, oversized write) ends the connection.

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use remem_client::{PageError, PageOp};

use crate::command::{page_cover, page_span, validate, Command};
use crate::error::{page_error_code, ConnectionError};
use crate::handshake::{Export, Negotiated};
use crate::log_limit::REQUEST_FAILURES;
use crate::protocol::*;
use crate::shards::SharedStore;
use crate::store::PageStore;

/// How much one connection may hold at once.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest READ or WRITE (the advertised maximum block size).
    pub max_request_bytes: u32,
    pub max_batch_requests: usize,
    /// A batch stops admitting requests past this many pages (its first request is always
    /// admitted).
    pub max_batch_pages: usize,
    /// How long a wait for input lasts before the stop flag is checked again.
    pub poll_interval_ms: i32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_request_bytes: 32 << 20,
            max_batch_requests: 256,
            max_batch_pages: 8192,
            poll_interval_ms: 200,
        }
    }
}

/// One request of a batch.
struct Pending {
    handle: u64,
    command: Result<Command, ErrorCode>,
    /// Index in the input buffer of a write's payload.
    payload_start: usize,
    /// Offset in the read arena of a read's first page.
    arena_start: usize,
    error: Option<(ErrorCode, String)>,
}

impl Pending {
    fn fail(&mut self, error: &PageError) {
        if self.error.is_none() {
            self.error = Some((page_error_code(error), error.to_string()));
        }
    }
}

/// A page read before it is partly overwritten (read-modify-write).
#[derive(Clone, Copy)]
struct Edge {
    pending: usize,
    page: u64,
}

#[derive(Default)]
struct Batch {
    pending: Vec<Pending>,
    pages: usize,
    /// Page spans written by the batch's writes so far (for the read-modify-write rule).
    written: Vec<(u64, u64)>,
    edges: Vec<Edge>,
    /// Op index -> pending index.
    owners: Vec<u32>,
    read_arena: Vec<u8>,
    edge_arena: Vec<u8>,
    ops: Vec<PageOp<'static>>,
    disconnect: bool,
}

impl Batch {
    fn clear(&mut self) {
        self.pending.clear();
        self.pages = 0;
        self.written.clear();
        self.disconnect = false;
    }
}

/// Reuses the allocation of an op list for ops that borrow other buffers. The list is empty,
/// so no op outlives its lifetime; collecting a `vec::IntoIter` into a `Vec` of a type of the
/// same layout keeps the allocation.
fn recycle<'a, 'b>(mut ops: Vec<PageOp<'a>>) -> Vec<PageOp<'b>> {
    ops.clear();
    ops.into_iter().map(|_| -> PageOp<'b> { unreachable!("the list was cleared") }).collect()
}

/// What the transmission phase reads from and writes to: a socket, maybe with TLS on it.
pub trait Socket: Read + Write {
    /// The descriptor to `poll` for input.
    fn raw_fd(&self) -> RawFd;
    /// Input already received and buffered above the socket (decrypted TLS records), which
    /// `poll` cannot see.
    fn input_buffered(&mut self) -> bool {
        false
    }
}

/// Waits up to `timeout_ms` for `fd` to be readable (or closed). False on timeout or signal.
pub(crate) fn poll_readable(fd: RawFd, timeout_ms: i32) -> io::Result<bool> {
    let mut pollfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: `pollfd` is a valid, exclusively borrowed pollfd for the whole call and nfds is 1.
    let ready = unsafe { libc::poll(&mut pollfd, 1, timeout_ms) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(error);
    }
    Ok(ready > 0)
}

enum Fill {
    /// Read what was there (possibly nothing).
    Drained,
    /// The client closed its end.
    Closed,
    /// The stop flag was raised while waiting.
    Stopped,
}

/// The transmission phase of one connection.
pub struct Transmission<'a, S, T> {
    socket: T,
    store: &'a S,
    /// Which engine this connection tries first ([`SharedStore::with_store`]).
    connection: u64,
    export: &'a Export,
    negotiated: Negotiated,
    limits: Limits,
    stop: &'a AtomicBool,
    input: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes from `start` that the next request needs in the buffer.
    need: usize,
    batch: Batch,
    output: Vec<u8>,
    page_bytes: usize,
}

impl<'a, S: SharedStore, T: Socket> Transmission<'a, S, T> {
    pub fn new(
        socket: T,
        store: &'a S,
        connection: u64,
        export: &'a Export,
        negotiated: Negotiated,
        limits: Limits,
        stop: &'a AtomicBool,
    ) -> Self {
        assert_eq!(export.page_bytes as usize % 512, 0);
        assert!(limits.max_request_bytes as u64 >= export.page_bytes as u64);
        Transmission {
            socket,
            store,
            connection,
            export,
            negotiated,
            limits,
            stop,
            input: vec![0; 1 << 20],
            start: 0,
            end: 0,
            need: REQUEST_HEADER_BYTES,
            batch: Batch::default(),
            output: Vec::with_capacity(1 << 20),
            page_bytes: export.page_bytes as usize,
        }
    }

    /// Serves requests until the client disconnects, the stop flag is raised or the client
    /// breaks the protocol.
    pub fn run(mut self) -> Result<(), ConnectionError> {
        let mut wait = false;
        loop {
            let fill = self.fill(wait)?;
            let consumed = self.collect_batch()?;
            if !self.batch.pending.is_empty() {
                self.run_batch()?;
                self.start += consumed;
                self.socket.write_all(&self.output)?;
                self.socket.flush()?;
                wait = false;
                if self.stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                continue;
            }
            if self.batch.disconnect {
                return Ok(());
            }
            match fill {
                Fill::Closed | Fill::Stopped => return Ok(()),
                Fill::Drained => wait = true,
            }
        }
    }

    /// Moves unparsed bytes to the front, grows the buffer to hold the next request, and reads
    /// what the socket has; with `wait`, first waits for at least one byte.
    fn fill(&mut self, mut wait: bool) -> Result<Fill, ConnectionError> {
        if self.start > 0 {
            self.input.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.input.len() < self.need {
            assert!(self.need <= REQUEST_HEADER_BYTES + self.limits.max_request_bytes as usize);
            self.input.resize(self.need, 0);
        }
        let fd = self.socket.raw_fd();
        loop {
            if self.end == self.input.len() {
                return Ok(Fill::Drained);
            }
            let timeout = if wait { self.limits.poll_interval_ms } else { 0 };
            if !self.socket.input_buffered() && !poll_readable(fd, timeout)? {
                if !wait {
                    return Ok(Fill::Drained);
                }
                if self.stop.load(Ordering::Relaxed) {
                    return Ok(Fill::Stopped);
                }
                continue;
            }
            match self.socket.read(&mut self.input[self.end..]) {
                Ok(0) => return Ok(Fill::Closed),
                Ok(received) => {
                    self.end += received;
                    wait = false;
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(Fill::Drained),
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Parses complete requests from the buffer into the batch; returns the bytes they used.
    fn collect_batch(&mut self) -> Result<usize, ConnectionError> {
        self.batch.clear();
        self.need = 0;
        let page_bytes = self.export.page_bytes;
        let mut cursor = self.start;
        while self.batch.pending.len() < self.limits.max_batch_requests {
            let available = self.end - cursor;
            if available < REQUEST_HEADER_BYTES {
                self.need = REQUEST_HEADER_BYTES;
                break;
            }
            let header_bytes: &[u8; REQUEST_HEADER_BYTES] =
                self.input[cursor..cursor + REQUEST_HEADER_BYTES].try_into().expect("header slice");
            let header = decode_request(header_bytes)?;
            let payload_bytes = if header.command == CMD_WRITE {
                if header.length > self.limits.max_request_bytes {
                    return Err(ConnectionError::WriteTooLarge {
                        length: header.length,
                        max_bytes: self.limits.max_request_bytes,
                    });
                }
                header.length as usize
            } else {
                0
            };
            if available < REQUEST_HEADER_BYTES + payload_bytes {
                self.need = REQUEST_HEADER_BYTES + payload_bytes;
                break;
            }
            let command = validate(
                &header,
                self.export.size_bytes,
                page_bytes,
                self.limits.max_request_bytes,
                self.negotiated.structured_replies,
            );
            let batch = &mut self.batch;
            match command {
                Ok(Command::Disconnect) => {
                    if batch.pending.is_empty() {
                        batch.disconnect = true;
                        cursor += REQUEST_HEADER_BYTES;
                    }
                    break;
                }
                Ok(barrier) if barrier.is_barrier() && !batch.pending.is_empty() => break,
                Ok(Command::Read { offset, length }) | Ok(Command::Write { offset, length }) => {
                    let pages =
                        page_span(offset, length, page_bytes).map_or(0, |(first, last)| last - first + 1);
                    let over_budget = batch.pages + pages as usize > self.limits.max_batch_pages;
                    if !batch.pending.is_empty() && over_budget {
                        break;
                    }
                    if let (Ok(Command::Write { .. }), Some((first, last))) =
                        (command, page_span(offset, length, page_bytes))
                    {
                        let conflict = [first, last].iter().any(|&page| {
                            let (_, covered) = page_cover(offset, length, page_bytes, page);
                            covered < page_bytes as usize
                                && batch.written.iter().any(|&(low, high)| low <= page && page <= high)
                        });
                        if conflict {
                            break;
                        }
                        batch.written.push((first, last));
                    }
                    batch.pages += pages as usize;
                }
                _ => {}
            }
            let barrier = matches!(command, Ok(command) if command.is_barrier());
            self.batch.pending.push(Pending {
                handle: header.handle,
                command,
                payload_start: cursor + REQUEST_HEADER_BYTES,
                arena_start: 0,
                error: None,
            });
            cursor += REQUEST_HEADER_BYTES + payload_bytes;
            if barrier {
                break;
            }
        }
        Ok(cursor - self.start)
    }

    /// Runs the batch on the store (under its lock) and leaves the replies in `output`.
    fn run_batch(&mut self) -> Result<(), ConnectionError> {
        let page_bytes = self.page_bytes;
        let batch = &mut self.batch;
        let input = &self.input[..self.end];
        batch.plan(page_bytes);
        self.store.with_store(self.connection, &mut |store: &mut dyn PageStore| {
            batch.patch_edges(store, input, page_bytes);
            batch.discard_whole_pages(store, page_bytes);
            batch.read_and_write(store, input, page_bytes);
        })?;
        self.encode_replies();
        Ok(())
    }

    /// The replies of the batch, in request order, into `output`.
    fn encode_replies(&mut self) {
        let page_bytes = self.page_bytes;
        let Batch { pending, read_arena, .. } = &self.batch;
        self.output.clear();
        let structured = self.negotiated.structured_replies;
        for request in pending.iter() {
            let handle = request.handle;
            let error = match (&request.command, &request.error) {
                (_, Some((code, message))) => Some((*code, message.as_str())),
                (Err(code), None) => Some((*code, "invalid request")),
                (Ok(_), None) => None,
            };
            match (error, request.command) {
                (Some((code, message)), _) => {
                    if REQUEST_FAILURES.allow() {
                        tracing::warn!(handle, error = code.name(), message, "NBD request failed");
                    }
                    if structured {
                        encode_error_chunk(handle, code, message, &mut self.output);
                    } else {
                        encode_simple_reply(code.value(), handle, &mut self.output);
                    }
                }
                (None, Ok(Command::Read { offset, length })) => {
                    let start = request.arena_start + (offset % page_bytes as u64) as usize;
                    let data = &read_arena[start..start + length as usize];
                    if !structured {
                        encode_simple_reply(0, handle, &mut self.output);
                    } else if length == 0 {
                        encode_chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, handle, 0, &mut self.output);
                    } else {
                        encode_chunk_header(
                            REPLY_FLAG_DONE,
                            REPLY_TYPE_OFFSET_DATA,
                            handle,
                            8 + length,
                            &mut self.output,
                        );
                        self.output.extend_from_slice(&offset.to_be_bytes());
                    }
                    self.output.extend_from_slice(data);
                }
                (None, _) => encode_simple_reply(0, handle, &mut self.output),
            }
        }
    }
}

/// The steps of a batch on the store, in order (`Transmission::run_batch`).
impl Batch {
    /// Plan: arena space for reads, the partial pages of writes (`edges`).
    fn plan(&mut self, page_bytes: usize) {
        let page_size = page_bytes as u32;
        let Batch { pending, edges, read_arena, edge_arena, .. } = self;
        edges.clear();
        let mut read_bytes = 0;
        for (index, request) in pending.iter_mut().enumerate() {
            match request.command {
                Ok(Command::Read { offset, length }) => {
                    if let Some((first, last)) = page_span(offset, length, page_size) {
                        request.arena_start = read_bytes;
                        read_bytes += (last - first + 1) as usize * page_bytes;
                    }
                }
                Ok(Command::Write { offset, length }) | Ok(Command::WriteZeroes { offset, length, .. }) => {
                    if let Some((first, last)) = page_span(offset, length, page_size) {
                        for page in [first, last] {
                            let partial = page_cover(offset, length, page_size, page).1 < page_bytes;
                            if partial
                                && edges.last().is_none_or(|edge| edge.page != page || edge.pending != index)
                            {
                                edges.push(Edge { pending: index, page });
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        if read_arena.len() < read_bytes {
            read_arena.resize(read_bytes, 0);
        }
        if edge_arena.len() < edges.len() * page_bytes {
            edge_arena.resize(edges.len() * page_bytes, 0);
        }
    }

    /// Phase 1: reads the pages that writes cover in part, then patches them.
    fn patch_edges(&mut self, store: &mut dyn PageStore, input: &[u8], page_bytes: usize) {
        let page_size = page_bytes as u32;
        let Batch { pending, edges, edge_arena, ops, .. } = self;
        if !edges.is_empty() {
            let mut edge_ops = recycle(std::mem::take(ops));
            for (edge, buf) in edges.iter().zip(edge_arena.chunks_mut(page_bytes)) {
                edge_ops.push(PageOp::Read { page: edge.page, buf });
            }
            store.execute(&mut edge_ops, &mut |done| {
                if let Err(error) = &done.result {
                    pending[edges[done.index].pending].fail(error);
                }
            });
            *ops = recycle(edge_ops);
            for (edge, buf) in edges.iter().zip(edge_arena.chunks_mut(page_bytes)) {
                let request = &pending[edge.pending];
                if request.error.is_some() {
                    continue;
                }
                match request.command {
                    Ok(Command::Write { offset, length }) => {
                        let (start, len) = page_cover(offset, length, page_size, edge.page);
                        let source = request.payload_start
                            + (edge.page * page_bytes as u64 + start as u64 - offset) as usize;
                        buf[start..start + len].copy_from_slice(&input[source..source + len]);
                    }
                    Ok(Command::WriteZeroes { offset, length, .. }) => {
                        let (start, len) = page_cover(offset, length, page_size, edge.page);
                        buf[start..start + len].fill(0);
                    }
                    _ => unreachable!("only writes have edges"),
                }
            }
        }
    }

    /// Discards: only barrier batches have them, so no op of this batch is in flight.
    fn discard_whole_pages(&mut self, store: &mut dyn PageStore, page_bytes: usize) {
        let pending = &mut self.pending;
        for request in pending.iter_mut() {
            let (offset, length) = match request.command {
                Ok(Command::Trim { offset, length }) => (offset, length),
                Ok(Command::WriteZeroes { offset, length, .. }) if request.error.is_none() => {
                    (offset, length)
                }
                _ => continue,
            };
            // Whole pages only: a trim may round inwards (spec), and write-zeroes rewrites the
            // partial pages in phase 2.
            let first = offset.div_ceil(page_bytes as u64);
            let end = (offset + length as u64) / page_bytes as u64;
            for page in first..end {
                if let Err(error) = store.discard_page(page) {
                    request.fail(&error);
                    break;
                }
            }
        }
    }

    /// Phase 2: reads and writes, in request order.
    fn read_and_write(&mut self, store: &mut dyn PageStore, input: &[u8], page_bytes: usize) {
        let page_size = page_bytes as u32;
        let Batch { pending, edges, owners, read_arena, edge_arena, ops, .. } = self;
        owners.clear();
        let mut main_ops = recycle(std::mem::take(ops));
        let mut read_pages = read_arena.chunks_mut(page_bytes);
        let mut edge_pages = edges.iter().zip(edge_arena.chunks(page_bytes)).peekable();
        for (index, request) in pending.iter().enumerate() {
            let owner = index as u32;
            match request.command {
                Ok(Command::Read { offset, length }) => {
                    let Some((first, last)) = page_span(offset, length, page_size) else { continue };
                    for page in first..=last {
                        let buf = read_pages.next().expect("the arena holds every read page");
                        main_ops.push(PageOp::Read { page, buf });
                        owners.push(owner);
                    }
                }
                Ok(Command::Write { offset, length }) | Ok(Command::WriteZeroes { offset, length, .. }) => {
                    let zeroes = matches!(request.command, Ok(Command::WriteZeroes { .. }));
                    let Some((first, last)) = page_span(offset, length, page_size) else { continue };
                    for page in first..=last {
                        let edge = edge_pages.next_if(|(edge, _)| edge.pending == index && edge.page == page);
                        let data = match edge {
                            Some((_, patched)) => patched,
                            // Whole pages of write-zeroes were discarded above.
                            None if zeroes => continue,
                            None => {
                                let source =
                                    request.payload_start + (page * page_bytes as u64 - offset) as usize;
                                &input[source..source + page_bytes]
                            }
                        };
                        if request.error.is_none() {
                            main_ops.push(PageOp::Write { page, data });
                            owners.push(owner);
                        }
                    }
                }
                _ => {}
            }
        }
        if !main_ops.is_empty() {
            store.execute(&mut main_ops, &mut |done| {
                if let Err(error) = &done.result {
                    pending[owners[done.index] as usize].fail(error);
                }
            });
        }
        *ops = recycle(main_ops);
    }
}
