//! What the NBD server needs from remote memory, as a trait: the remem client implements it,
//! and an in-memory model implements it for tests (the reference model of STYLE.md: a map from
//! page to bytes), with pages that can be marked lost to show the error paths.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use remem_client::{Client, OpDone, PageError, PageOp};

/// Page I/O with the contract of [`remem_client::Client`]: `execute` runs a batch and reports
/// each op once, in completion order; ops on one page run in batch order; `discard_page` makes
/// a page read as zeros and is called between batches only.
pub trait PageStore {
    fn page_bytes(&self) -> usize;
    fn page_count(&self) -> u64;
    fn execute(&mut self, ops: &mut [PageOp<'_>], on_done: &mut dyn FnMut(OpDone));
    fn discard_page(&mut self, page: u64) -> Result<(), PageError>;
    /// Background work while no request is in flight (heartbeats, rebuilds, probes of failed
    /// nodes): the server calls it every [`crate::server::BACKGROUND_INTERVAL`], so the export
    /// heals even when nobody does I/O.
    fn background(&mut self) {}
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

/// Pages in a `HashMap`, for tests. Pages in `lost` fail reads and writes as remem does when
/// r+1 of their nodes are gone.
#[derive(Default)]
pub struct MemoryStore {
    pub page_bytes: usize,
    pub page_count: u64,
    pub pages: HashMap<u64, Vec<u8>>,
    pub lost: HashSet<u64>,
    /// Ops seen, for tests that check batching.
    pub ops_executed: usize,
    pub batches_executed: usize,
}

impl MemoryStore {
    pub fn new(page_bytes: usize, page_count: u64) -> MemoryStore {
        MemoryStore { page_bytes, page_count, ..MemoryStore::default() }
    }

    fn lost_error(page: u64) -> PageError {
        PageError::Lost { page, range: 0, valid_splits: 0, needed_splits: 1, failed_nodes: Vec::new() }
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
        // Complete in reverse order: callers must not rely on completion order.
        let mut results = Vec::with_capacity(ops.len());
        for op in ops.iter_mut() {
            self.ops_executed += 1;
            let result = match op {
                // A page in memory has no splits: writing its data splits is writing it, and
                // its parities are never stale.
                PageOp::WriteParity { page, data } => {
                    assert_eq!(data.len(), self.page_bytes, "a write is one page");
                    assert!(*page < self.page_count, "page {page} out of range");
                    Ok(())
                }
                PageOp::Write { page, data } | PageOp::WriteData { page, data } => {
                    assert_eq!(data.len(), self.page_bytes, "a write is one page");
                    assert!(*page < self.page_count, "page {page} out of range");
                    if self.lost.contains(page) {
                        Err(PageError::WriteFailed {
                            page: *page,
                            range: 0,
                            stored_splits: 0,
                            needed_splits: 1,
                            failed_nodes: Vec::new(),
                        })
                    } else {
                        self.pages.insert(*page, data.to_vec());
                        Ok(())
                    }
                }
                PageOp::Read { page, buf } => {
                    assert_eq!(buf.len(), self.page_bytes, "a read is one page");
                    assert!(*page < self.page_count, "page {page} out of range");
                    if self.lost.contains(page) {
                        buf.fill(0xEE);
                        Err(Self::lost_error(*page))
                    } else {
                        match self.pages.get(page) {
                            Some(data) => buf.copy_from_slice(data),
                            None => buf.fill(0),
                        }
                        Ok(())
                    }
                }
                // Probes measure a transport; a store in memory has none to measure.
                PageOp::Probe { .. } => Err(PageError::Protocol {
                    address: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                    message: "a memory store has no transport to probe".into(),
                }),
            };
            results.push(result);
        }
        for (index, result) in results.into_iter().enumerate().rev() {
            on_done(OpDone {
                index,
                result,
                latency: Duration::ZERO,
                started: std::time::Instant::now(),
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
        Ok(())
    }
}
