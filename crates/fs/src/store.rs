//! The page store under the file system: the remem client, or a `HashMap` model in tests.
//!
//! Contract: `execute_each` runs every op of the batch to its end and names each op that
//! failed (`execute` returns the first error); a read returns the page's last completed write
//! or an error, never other bytes; a page never written, or discarded since, reads as zeros.
//! Ops on the same page run in batch order.

use std::path::{Path, PathBuf};

use remem_client::{Client, PageError, PageOp, SlabMapError};

pub trait PageStore: Send {
    fn page_bytes(&self) -> usize;
    fn page_count(&self) -> u64;
    /// Runs a batch of page ops (pages in flight at once) to its end; `failed(index, error)`
    /// hears of each op that failed, by its index in `ops`.
    fn execute_each(&mut self, ops: &mut [PageOp<'_>], failed: &mut dyn FnMut(usize, PageError));
    /// Runs a batch of page ops (pages in flight at once); the first error, if any.
    fn execute(&mut self, ops: &mut [PageOp<'_>]) -> Result<(), PageError> {
        let mut first_error = None;
        self.execute_each(ops, &mut |_, error| {
            first_error.get_or_insert(error);
        });
        first_error.map_or(Ok(()), Err)
    }
    /// Forgets a page: it reads as zeros, without remote I/O, until written again.
    fn discard_page(&mut self, page: u64) -> Result<(), PageError>;
    /// Background work between requests (heartbeats, rebuilds, probes).
    fn background(&mut self);
}

impl PageStore for Client {
    fn page_bytes(&self) -> usize {
        Client::page_bytes(self)
    }

    fn page_count(&self) -> u64 {
        Client::page_count(self)
    }

    fn execute_each(&mut self, ops: &mut [PageOp<'_>], failed: &mut dyn FnMut(usize, PageError)) {
        Client::execute(self, ops, |done| {
            if let Err(error) = done.result {
                failed(done.index, error);
            }
        });
    }

    fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        Client::discard_page(self, page)
    }

    fn background(&mut self) {
        self.poll_background(std::time::Duration::ZERO);
    }
}

/// The remem client of a file system that survives restarts: its slab map is saved when it is
/// made and again after every rebuild (rebuilds move slabs), so a restart finds the pages
/// where they are now.
pub struct SavedMapClient {
    pub client: Client,
    map_path: PathBuf,
    rebuilds_saved: u64,
}

impl SavedMapClient {
    /// Wraps `client` and saves its map to `map_path` at once (durably).
    pub fn new(client: Client, map_path: &Path) -> Result<SavedMapClient, SlabMapError> {
        let rebuilds_saved = client.regeneration_status().done;
        let saved = SavedMapClient { client, map_path: map_path.to_owned(), rebuilds_saved };
        saved.save()?;
        Ok(saved)
    }

    fn save(&self) -> Result<(), SlabMapError> {
        // Durable: the file synced before its rename, the directory after (SlabMapFile::save).
        self.client.save_map(&self.map_path)
    }
}

impl PageStore for SavedMapClient {
    fn page_bytes(&self) -> usize {
        self.client.page_bytes()
    }

    fn page_count(&self) -> u64 {
        self.client.page_count()
    }

    fn execute_each(&mut self, ops: &mut [PageOp<'_>], failed: &mut dyn FnMut(usize, PageError)) {
        PageStore::execute_each(&mut self.client, ops, failed);
    }

    fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        self.client.discard_page(page)
    }

    fn background(&mut self) {
        self.client.poll_background(std::time::Duration::ZERO);
        let done = self.client.regeneration_status().done;
        if done != self.rebuilds_saved {
            match self.save() {
                Ok(()) => self.rebuilds_saved = done,
                Err(error) => tracing::warn!(%error, "cannot save the slab map after a rebuild; will retry"),
            }
        }
    }
}

/// Remote memory as a `HashMap`: the reference model of the data path's tests.
#[cfg(test)]
#[derive(Default)]
pub struct MemoryStore {
    pub pages: std::collections::HashMap<u64, Vec<u8>>,
    pub page_count: u64,
    /// Page ops run so far (reads and writes), to check that holes cost no I/O.
    pub ops_run: u64,
    /// Batches run so far (calls of `execute_each`), to check that requests share batches.
    pub batches_run: u64,
    /// When set, every op fails as if r+1 nodes were down.
    pub failing: bool,
    /// Remem pages whose ops fail as if r+1 nodes of their range were down.
    pub failing_pages: std::collections::HashSet<u64>,
}

#[cfg(test)]
impl PageStore for MemoryStore {
    fn page_bytes(&self) -> usize {
        4096
    }

    fn page_count(&self) -> u64 {
        self.page_count
    }

    fn execute_each(&mut self, ops: &mut [PageOp<'_>], failed: &mut dyn FnMut(usize, PageError)) {
        self.batches_run += 1;
        for (index, op) in ops.iter_mut().enumerate() {
            self.ops_run += 1;
            let page = match op {
                PageOp::Write { page, .. } | PageOp::Read { page, .. } => *page,
                _ => panic!("the file system issues whole writes and reads only"),
            };
            assert!(page < self.page_count, "page {page} beyond the store");
            if self.failing || self.failing_pages.contains(&page) {
                let lost = PageError::Lost {
                    page,
                    range: 0,
                    valid_splits: 7,
                    needed_splits: 8,
                    failed_nodes: Vec::new(),
                };
                failed(index, lost);
                continue;
            }
            match op {
                PageOp::Write { page, data } => {
                    self.pages.insert(*page, data.to_vec());
                }
                PageOp::Read { page, buf } => match self.pages.get(page) {
                    Some(data) => buf.copy_from_slice(data),
                    None => buf.fill(0),
                },
                _ => unreachable!(),
            }
        }
    }

    fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        self.pages.remove(&page);
        Ok(())
    }

    fn background(&mut self) {}
}
