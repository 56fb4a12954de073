//! Page operations of the kv server over its page client (`PageClient`: the poll driver, or
//! the simulator's adapter): each op has a slot with its own
//! 4 KiB buffer, named by the slot index (the engine's tag), and a waiting queue for ops the
//! engine cannot start yet (every op slot busy, or another op on the same page in flight).
//!
//! Ops are submitted unflushed: their frames leave together at the next `on_readable` or
//! `on_timer`, which the server calls after every batch of requests (one write per node for all
//! the pages of a value, not one per page).
//!
//! Invariant: a slot's buffer belongs to the engine from submit to completion; a write's bytes
//! are copied into its slot when it is asked for, so the caller's value may go away at once.
//! Ops on one page start in the order they were asked (the queue is FIFO and the engine refuses
//! a second op on a page in flight).

use std::collections::VecDeque;

use remem_client::engine::OpBuffers;
use remem_client::{PageError, Submit};

use crate::page_client::PageClient;
use crate::space::PAGE_BYTES;

pub type TaskId = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    /// EOR: the data splits only (parities written later by `WriteParity`).
    WriteData,
    /// EOR -> EC: the parities, at the page's current version.
    WriteParity,
}

/// What an op is for: the task and a number the task chooses (which page of its value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoOwner {
    pub task: TaskId,
    pub part: u32,
}

struct IoSlot {
    buffer: Box<[u8]>,
    kind: IoKind,
    page: u64,
    owner: IoOwner,
    busy: bool,
}

/// A finished op: its owner, result, and (for reads) the page bytes in `PageIo::buffer(slot)`.
#[derive(Debug)]
pub struct IoDone {
    pub slot: usize,
    pub owner: IoOwner,
    pub kind: IoKind,
    pub page: u64,
    pub result: Result<(), PageError>,
    /// A read that decoded because a data split was missing (`OpDone::degraded`); a read that
    /// decoded because a parity came before a late data split is not.
    pub degraded: bool,
}

pub struct PageIo {
    slots: Vec<IoSlot>,
    free: Vec<usize>,
    waiting: VecDeque<usize>,
    /// Bytes moved, for the transition accounting: (read, written) page bytes by kind.
    pub reads: u64,
    pub writes: u64,
    /// Ops were submitted whose frames have not been flushed yet.
    pub unflushed: bool,
}

struct Buffers<'a>(&'a mut [IoSlot]);

impl OpBuffers for Buffers<'_> {
    fn read_buffer(&mut self, tag: usize) -> &mut [u8] {
        &mut self.0[tag].buffer
    }
}

impl PageIo {
    pub fn new() -> PageIo {
        PageIo {
            slots: Vec::new(),
            free: Vec::new(),
            waiting: VecDeque::new(),
            reads: 0,
            writes: 0,
            unflushed: false,
        }
    }

    fn claim(&mut self, kind: IoKind, page: u64, owner: IoOwner) -> usize {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push(IoSlot {
                    buffer: vec![0; PAGE_BYTES].into_boxed_slice(),
                    kind,
                    page,
                    owner,
                    busy: false,
                });
                self.slots.len() - 1
            }
        };
        let slot = &mut self.slots[index];
        assert!(!slot.busy);
        slot.kind = kind;
        slot.page = page;
        slot.owner = owner;
        slot.busy = true;
        index
    }

    /// Asks for a page read; the bytes are in [`PageIo::buffer`] when it completes.
    pub fn read<P: PageClient>(&mut self, client: &mut P, page: u64, owner: IoOwner) {
        let slot = self.claim(IoKind::Read, page, owner);
        self.start(client, slot);
    }

    /// Asks for a write of `data` (at most a page; the rest of the page is zeros).
    pub fn write<P: PageClient>(
        &mut self,
        client: &mut P,
        kind: IoKind,
        page: u64,
        data: &[u8],
        owner: IoOwner,
    ) {
        assert!(kind != IoKind::Read && data.len() <= PAGE_BYTES);
        let slot = self.claim(kind, page, owner);
        let buffer = &mut self.slots[slot].buffer;
        buffer[..data.len()].copy_from_slice(data);
        buffer[data.len()..].fill(0);
        self.start(client, slot);
    }

    fn start<P: PageClient>(&mut self, client: &mut P, slot: usize) {
        if !self.waiting.is_empty() || !self.submit(client, slot) {
            self.waiting.push_back(slot);
        }
    }

    fn submit<P: PageClient>(&mut self, client: &mut P, slot: usize) -> bool {
        let (kind, page) = (self.slots[slot].kind, self.slots[slot].page);
        // A write's data is its slot's own buffer, and the engine is handed every slot (for
        // reads): lend the buffer out of the slot for the call instead of copying it. A write
        // never asks for its own read buffer.
        let data =
            if kind == IoKind::Read { Box::default() } else { std::mem::take(&mut self.slots[slot].buffer) };
        let op = match kind {
            IoKind::Read => Submit::Read { page },
            IoKind::Write => Submit::Write { page, data: &data },
            IoKind::WriteData => Submit::WriteData { page, data: &data },
            IoKind::WriteParity => Submit::WriteParity { page, data: &data },
        };
        let started = client.submit_unflushed(slot, op, &mut Buffers(&mut self.slots));
        if kind != IoKind::Read {
            self.slots[slot].buffer = data;
        }
        if started {
            self.unflushed = true;
            match kind {
                IoKind::Read => self.reads += 1,
                _ => self.writes += 1,
            }
        }
        started
    }

    /// Starts waiting ops, in order, while the engine takes them. An op refused because its
    /// page is busy waits, and so does everything behind it on that page.
    pub fn start_waiting<P: PageClient>(&mut self, client: &mut P) {
        let mut still_waiting = VecDeque::new();
        let mut blocked_pages = Vec::new();
        while let Some(slot) = self.waiting.pop_front() {
            let page = self.slots[slot].page;
            if blocked_pages.contains(&page) || !self.submit(client, slot) {
                if client.in_flight() >= client_slot_limit(client) {
                    // Every engine slot is busy: keep the rest in order and stop.
                    still_waiting.push_back(slot);
                    still_waiting.extend(self.waiting.drain(..));
                    break;
                }
                blocked_pages.push(page);
                still_waiting.push_back(slot);
            }
        }
        self.waiting = still_waiting;
    }

    /// Runs `work` with the slots' buffers as the engine's (a call that turns the client's
    /// loop while ops are in flight).
    pub fn with_buffers<T>(&mut self, work: impl FnOnce(&mut dyn OpBuffers) -> T) -> T {
        work(&mut Buffers(&mut self.slots))
    }

    /// Lets the engine read its sockets and advance; returns finished ops.
    pub fn on_readable<P: PageClient>(&mut self, client: &mut P, done: &mut Vec<IoDone>) {
        client.on_readable(&mut Buffers(&mut self.slots));
        self.unflushed = false;
        self.collect(client, done);
    }

    pub fn on_timer<P: PageClient>(&mut self, client: &mut P, done: &mut Vec<IoDone>) {
        client.on_timer(&mut Buffers(&mut self.slots));
        self.unflushed = false;
        self.collect(client, done);
    }

    fn collect<P: PageClient>(&mut self, client: &mut P, done: &mut Vec<IoDone>) {
        for op in client.completions() {
            let slot = &self.slots[op.index];
            done.push(IoDone {
                slot: op.index,
                owner: slot.owner,
                kind: slot.kind,
                page: slot.page,
                result: op.result,
                degraded: op.degraded,
            });
        }
    }

    /// The page bytes of a finished read.
    pub fn buffer(&self, slot: usize) -> &[u8] {
        &self.slots[slot].buffer
    }

    /// Gives a finished op's slot back.
    pub fn finish(&mut self, slot: usize) {
        assert!(self.slots[slot].busy);
        self.slots[slot].busy = false;
        self.free.push(slot);
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn busy(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

impl Default for PageIo {
    fn default() -> PageIo {
        PageIo::new()
    }
}

fn client_slot_limit<P: PageClient>(client: &mut P) -> usize {
    client.engine().slot_count()
}

/// Engine op slots: page ops in flight at once.
pub const PAGE_OPS_IN_FLIGHT: usize = 256;
