//! The page store under the block and file front ends (`remem nbd`, `remem fs`), as one trait:
//! the remem client implements it, and [`MemoryStore`], a `HashMap` of pages, is the reference
//! model their tests run on (STYLE.md), with pages that can be made to fail as remem's do when
//! r+1 nodes of their range are gone.
//!
//! Contract (that of [`remem_client::Client::execute`]): `execute` runs every op of the batch
//! (pages in flight at once) to its end and reports each op once, in completion order; ops on
//! one page run in batch order; a read returns the page's last completed write or an error,
//! never other bytes; a page never written, or discarded since, reads as zeros; `discard_page`
//! is called between batches only.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use remem_client::{Client, OpDone, PageError, PageOp};

pub trait PageStore: Send {
    fn page_bytes(&self) -> usize;
    fn page_count(&self) -> u64;
    /// Runs a batch of page ops to its end; `on_done` hears of each op once.
    fn execute(&mut self, ops: &mut [PageOp<'_>], on_done: &mut dyn FnMut(OpDone));
    /// Forgets a page: it reads as zeros, without remote I/O, until written again.
    fn discard_page(&mut self, page: u64) -> Result<(), PageError>;
    /// Background work between requests (heartbeats, rebuilds, probes of failed nodes): front
    /// ends call it while idle too, so an export heals when nobody does I/O.
    fn background(&mut self) {}

    /// Runs a batch; `failed(index, error)` hears of each op that failed, by its index in `ops`.
    fn execute_each(&mut self, ops: &mut [PageOp<'_>], failed: &mut dyn FnMut(usize, PageError)) {
        self.execute(ops, &mut |done| {
            if let Err(error) = done.result {
                failed(done.index, error);
            }
        });
    }

    /// Runs a batch; the first error, if any.
    fn execute_all(&mut self, ops: &mut [PageOp<'_>]) -> Result<(), PageError> {
        let mut first_error = None;
        self.execute_each(ops, &mut |_, error| {
            first_error.get_or_insert(error);
        });
        first_error.map_or(Ok(()), Err)
    }
}

impl PageStore for Client {
    fn page_bytes(&self) -> usize {
        Client::page_bytes(self)
    }

    fn page_count(&self) -> u64 {
        Client::page_count(self)
    }

    fn execute(&mut self, ops: &mut [PageOp<'_>], on_done: &mut dyn FnMut(OpDone)) {
        Client::execute(self, ops, on_done)
    }

    fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        Client::discard_page(self, page)
    }

    fn background(&mut self) {
        self.poll_background(Duration::ZERO);
    }
}

/// Pages in a `HashMap`: the reference model of the front ends' data-path tests. Pages in
/// `lost`, or every page while `failing`, fail reads and writes as remem's do when r+1 nodes
/// of their range are gone (a failed read fills its buffer with 0xEE, which no caller may pass
/// on, and names a failed node). Pages in `torn` fail reads as a page does whose last write was
/// cut short by a crash: every node answered, but no k splits agree (no failed node named).
/// The node a [`MemoryStore`]'s lost pages name as failed.
pub const MODEL_NODE: std::net::SocketAddr =
    std::net::SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(192, 0, 2, 1), 7100));

#[derive(Default)]
pub struct MemoryStore {
    pub page_bytes: usize,
    pub page_count: u64,
    pub pages: HashMap<u64, Vec<u8>>,
    pub lost: HashSet<u64>,
    pub torn: HashSet<u64>,
    pub failing: bool,
    /// Ops run so far (to check that holes cost no I/O) and batches (that requests share them).
    pub ops_executed: u64,
    pub batches_executed: u64,
}

impl MemoryStore {
    pub fn new(page_bytes: usize, page_count: u64) -> MemoryStore {
        MemoryStore { page_bytes, page_count, ..MemoryStore::default() }
    }

    fn fails(&self, page: u64) -> bool {
        self.failing || self.lost.contains(&page)
    }

    fn run(&mut self, op: &mut PageOp<'_>) -> Result<(), PageError> {
        match op {
            // A page in memory has no splits: writing its data splits is writing it, and its
            // parities are never stale.
            PageOp::WriteParity { page, data } => {
                self.check(*page, data.len());
                Ok(())
            }
            PageOp::Write { page, data } | PageOp::WriteData { page, data } => {
                self.check(*page, data.len());
                if self.fails(*page) {
                    return Err(PageError::WriteFailed {
                        page: *page,
                        range: 0,
                        stored_splits: 0,
                        needed_splits: 1,
                        failed_nodes: Vec::new(),
                    });
                }
                self.torn.remove(page);
                self.pages.insert(*page, data.to_vec());
                Ok(())
            }
            PageOp::Read { page, buf } => {
                self.check(*page, buf.len());
                let (lost, torn) = (self.fails(*page), self.torn.contains(page));
                if lost || torn {
                    buf.fill(0xEE);
                    let page = *page;
                    let failed_nodes = if lost { vec![MODEL_NODE] } else { Vec::new() };
                    return Err(PageError::Lost {
                        page,
                        range: 0,
                        valid_splits: 0,
                        needed_splits: 1,
                        failed_nodes,
                    });
                }
                match self.pages.get(page) {
                    Some(data) => buf.copy_from_slice(data),
                    None => buf.fill(0),
                }
                Ok(())
            }
            // Probes measure a transport; a store in memory has none to measure.
            PageOp::Probe { .. } => Err(PageError::Protocol {
                address: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                message: "a memory store has no transport to probe".into(),
            }),
        }
    }

    fn check(&self, page: u64, bytes: usize) {
        assert_eq!(bytes, self.page_bytes, "an op is one page");
        assert!(page < self.page_count, "page {page} out of range");
    }
}

impl PageStore for MemoryStore {
    fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    fn page_count(&self) -> u64 {
        self.page_count
    }

    fn execute(&mut self, ops: &mut [PageOp<'_>], on_done: &mut dyn FnMut(OpDone)) {
        self.batches_executed += 1;
        self.ops_executed += ops.len() as u64;
        let results: Vec<_> = ops.iter_mut().map(|op| self.run(op)).collect();
        // Completes in reverse order: callers must not rely on completion order.
        for (index, result) in results.into_iter().enumerate().rev() {
            let started = Instant::now();
            on_done(OpDone {
                index,
                result,
                latency: Duration::ZERO,
                started,
                decoded: false,
                degraded: false,
            });
        }
    }

    fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        if page >= self.page_count {
            return Err(PageError::OutOfRange { page, page_count: self.page_count });
        }
        self.pages.remove(&page);
        self.torn.remove(&page);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_reads_what_was_written_zeros_for_holes_and_fails_lost_pages() {
        let mut store = MemoryStore::new(8, 4);
        let written = [7u8; 8];
        store.execute_all(&mut [PageOp::Write { page: 1, data: &written }]).expect("write");
        let (mut one, mut two) = ([0u8; 8], [1u8; 8]);
        store
            .execute_all(&mut [
                PageOp::Read { page: 1, buf: &mut one },
                PageOp::Read { page: 2, buf: &mut two },
            ])
            .expect("reads");
        assert_eq!((one, two), ([7; 8], [0; 8]));
        store.lost.insert(1);
        let mut failed = Vec::new();
        store.execute_each(
            &mut [PageOp::Read { page: 2, buf: &mut two }, PageOp::Read { page: 1, buf: &mut one }],
            &mut |index, _| failed.push(index),
        );
        assert_eq!(failed, [1]);
        assert_eq!(one, [0xEE; 8], "a failed read never returns the old bytes");
        assert_eq!((store.batches_executed, store.ops_executed), (3, 5));
        store.discard_page(1).expect("discard");
        assert!(store.discard_page(4).is_err(), "beyond the store");
    }
}
