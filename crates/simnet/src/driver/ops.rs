//! Page ops of the simulated driver: what a caller submits, the table of ops queued or in the
//! engine (which is also the engine's read buffers), and what comes back.

use super::*;

/// A page operation for [`SimDriver::submit`] (what each does: `remem_client::Submit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimOp {
    Write {
        page: u64,
        data: Vec<u8>,
    },
    /// The page's data splits only: it becomes parity-stale.
    WriteData {
        page: u64,
        data: Vec<u8>,
    },
    /// The parities of a parity-stale page from `data`, which must be what its data splits hold.
    WriteParity {
        page: u64,
        data: Vec<u8>,
    },
    Read {
        page: u64,
    },
}

/// The kind of a [`SimOp`], as its completion reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimOpKind {
    Write,
    WriteData,
    WriteParity,
    Read,
}

impl SimOpKind {
    pub fn is_write(self) -> bool {
        self != SimOpKind::Read
    }
}

/// A finished op: its id (from [`SimDriver::submit`]), the page, and for a read the bytes.
#[derive(Debug)]
pub struct Completion {
    pub id: u64,
    pub page: u64,
    /// Any kind of write.
    pub is_write: bool,
    pub kind: SimOpKind,
    pub result: Result<(), PageError>,
    /// The page read (reads only; meaningful only when `result` is `Ok`).
    pub data: Vec<u8>,
    pub submitted_at: SimTime,
    pub completed_at: SimTime,
    pub decoded: bool,
    /// Decoded because a data split was missing, not merely late (`OpDone::degraded`).
    pub degraded: bool,
}

/// An op that was queued or in flight when the client crashed: it has no result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbandonedOp {
    pub id: u64,
    pub page: u64,
    /// Any kind of write.
    pub is_write: bool,
    pub kind: SimOpKind,
    /// Whether the engine had started it (its splits may be on the wire or stored).
    pub started: bool,
}

/// One op the driver holds: queued for a slot, or in the engine.
pub(super) struct OpEntry {
    pub(super) id: u64,
    pub(super) page: u64,
    pub(super) kind: SimOpKind,
    /// The data of a write not yet handed to the engine (the engine copies it at submit).
    pub(super) write: Option<Vec<u8>>,
    /// A read's page buffer.
    pub(super) buffer: Vec<u8>,
    pub(super) submitted_at: SimTime,
    pub(super) started: bool,
}

/// The ops table as the engine's buffers: the tag of an op is its index.
pub(super) struct OpTable<'a>(pub(super) &'a mut [Option<OpEntry>]);

impl OpBuffers for OpTable<'_> {
    fn read_buffer(&mut self, tag: usize) -> &mut [u8] {
        match self.0.get_mut(tag) {
            Some(Some(entry)) if entry.kind == SimOpKind::Read => &mut entry.buffer,
            _ => panic!("the engine asked for the read buffer of tag {tag}, which is no read in flight"),
        }
    }
}

impl SimDriver {
    /// Ops submitted and not completed yet (queued or in the engine).
    pub fn in_flight(&self) -> usize {
        self.ops.len() - self.free_tags.len()
    }

    /// Completions since the last call, in completion order.
    pub fn take_completed(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.completed)
    }

    /// Whether some engine op is waiting on `page`.
    pub fn page_busy(&self, page: u64) -> bool {
        self.ops.iter().flatten().any(|entry| entry.page == page)
    }

    /// Queues an op; it is handed to the engine as soon as a slot is free (ops run in
    /// submission order; ops on one page one at a time). Returns its id.
    pub fn submit(&mut self, op: SimOp) -> u64 {
        let id = self.next_op_id;
        self.next_op_id += 1;
        let (page, kind, write) = match op {
            SimOp::Write { page, data } => (page, SimOpKind::Write, Some(data)),
            SimOp::WriteData { page, data } => (page, SimOpKind::WriteData, Some(data)),
            SimOp::WriteParity { page, data } => (page, SimOpKind::WriteParity, Some(data)),
            SimOp::Read { page } => (page, SimOpKind::Read, None),
        };
        let buffer = if kind == SimOpKind::Read { vec![0; self.config.page_bytes] } else { Vec::new() };
        let entry = OpEntry { id, page, kind, write, buffer, submitted_at: self.now, started: false };
        let tag = self.hold_op(entry);
        self.queue.push_back(tag);
        self.stats.ops_submitted += 1;
        self.settle();
        id
    }

    /// Puts `entry` in the ops table (a free tag first) and returns its tag.
    pub(super) fn hold_op(&mut self, entry: OpEntry) -> usize {
        match self.free_tags.pop() {
            Some(tag) => {
                self.ops[tag] = Some(entry);
                tag
            }
            None => {
                self.ops.push(Some(entry));
                self.ops.len() - 1
            }
        }
    }

    /// Hands queued ops to the engine while it takes them. True if any was taken.
    pub(super) fn submit_queued(&mut self) -> bool {
        let mut any = false;
        while let Some(&tag) = self.queue.front() {
            let instant = self.instant();
            let entry = self.ops[tag].as_mut().expect("queued tags are live");
            let (page, kind) = (entry.page, entry.kind);
            let write = entry.write.take();
            let submit = match (kind, &write) {
                (SimOpKind::Read, _) => Submit::Read { page },
                (SimOpKind::Write, Some(data)) => Submit::Write { page, data },
                (SimOpKind::WriteData, Some(data)) => Submit::WriteData { page, data },
                (SimOpKind::WriteParity, Some(data)) => Submit::WriteParity { page, data },
                (_, None) => unreachable!("a queued write keeps its data until the engine takes it"),
            };
            let accepted = self.engine.submit(instant, tag, submit, &mut OpTable(&mut self.ops));
            if !accepted {
                self.ops[tag].as_mut().expect("still live").write = write;
                break;
            }
            self.ops[tag].as_mut().expect("still live").started = true;
            self.queue.pop_front();
            any = true;
            // The engine may have finished it at once; the next `collect_completions` reports it.
            self.collect_completions();
        }
        any
    }

    pub(super) fn collect_completions(&mut self) {
        let done: Vec<OpDone> = self.engine.take_completions().collect();
        for done in done {
            let tag = done.index;
            let entry = self.ops[tag].take().expect("the engine completes ops it was given");
            self.free_tags.push(tag);
            self.stats.ops_completed += 1;
            if let Err(error) = &done.result {
                let (id, page) = (entry.id, entry.page);
                self.note(|| format!("op {id} (page {page}) failed: {error}"));
            }
            self.completed.push(Completion {
                id: entry.id,
                page: entry.page,
                is_write: entry.kind.is_write(),
                kind: entry.kind,
                result: done.result,
                data: entry.buffer,
                submitted_at: entry.submitted_at,
                completed_at: self.now,
                decoded: done.decoded,
                degraded: done.degraded,
            });
        }
    }

    /// Reads one page and runs until the read completes (or `timeout` passes: `None`).
    pub fn read_now(&mut self, page: u64, timeout: SimTime) -> Option<Result<Vec<u8>, PageError>> {
        let id = self.submit(SimOp::Read { page });
        self.run_op(id, timeout).map(|completion| completion.result.map(|()| completion.data))
    }

    /// Writes one page and runs until the write completes (or `timeout` passes: `None`).
    pub fn write_now(&mut self, page: u64, data: Vec<u8>, timeout: SimTime) -> Option<Result<(), PageError>> {
        self.op_now(SimOp::Write { page, data }, timeout)
    }

    /// Runs one write of any kind until it completes (or `timeout` passes: `None`).
    pub fn op_now(&mut self, op: SimOp, timeout: SimTime) -> Option<Result<(), PageError>> {
        let id = self.submit(op);
        self.run_op(id, timeout).map(|completion| completion.result)
    }

    /// Runs until op `id` completes; other completions stay for [`SimDriver::take_completed`].
    fn run_op(&mut self, id: u64, timeout: SimTime) -> Option<Completion> {
        let limit = self.now + timeout;
        let done = |driver: &SimDriver| driver.completed.iter().any(|completion| completion.id == id);
        if !self.run_until_condition(limit, done) {
            return None;
        }
        let index = self.completed.iter().position(|completion| completion.id == id)?;
        Some(self.completed.remove(index))
    }
}
