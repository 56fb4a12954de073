//! How connections reach the store: one store behind one lock (one engine), or one store per
//! core with the export's pages sharded across them (`remem nbd --engines N`).
//!
//! Sharding. The export is cut into chunks of [`CHUNK_PAGES`] pages dealt round-robin to the
//! engines: chunk `c` belongs to engine `c % N`, where it is local chunk `c / N`. Each engine is
//! a whole remem client over its own address space (its own ranges, slabs and versions), so
//! engines share nothing: a page is only ever read and written by the one engine that owns it.
//! Small chunks spread even one sequential stream over every engine.
//!
//! Why engines are not threads of their own. On these machines waking a blocked thread on the
//! other core costs 20-25 us (docs/DESIGN.md's measured facts), more than an EC(8,2) batch of
//! 32 pages over shared memory takes to run. So no batch is handed to another thread: the
//! connection's thread runs each engine's part of its batch itself, run to completion, as the
//! single-engine server does. Each engine has its own lock, taken once per part of a batch and
//! never while another engine's is held; no lock is shared between engines. A connection starts
//! with the engine after the one the previous connection started with, and takes whichever of
//! its engines is free first, so two connections on two cores run two engines at once, and only
//! wait when both need the same engine at the same moment.

use std::sync::{Mutex, MutexGuard, TryLockError};

use remem_client::{OpDone, PageError, PageOp};

use crate::error::ConnectionError;
use crate::store::PageStore;

/// Pages per chunk of the round-robin deal (128 KiB of 4 KiB pages).
pub const CHUNK_PAGES: u64 = 32;

/// What a connection runs its batches on.
pub trait SharedStore: Sync {
    /// Runs `work` with a store for one batch. `connection` says which engine the connection
    /// tries first.
    fn with_store(
        &self,
        connection: u64,
        work: &mut dyn FnMut(&mut dyn PageStore),
    ) -> Result<(), ConnectionError>;
    /// Background work of every engine (see [`PageStore::background`]).
    fn background(&self);
}

fn lock<S>(store: &Mutex<S>) -> MutexGuard<'_, S> {
    // A panic on a connection thread leaves the store as consistent as the engine left it;
    // the engine's own checks judge every later op.
    store.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<S: PageStore + Send> SharedStore for Mutex<S> {
    fn with_store(
        &self,
        _connection: u64,
        work: &mut dyn FnMut(&mut dyn PageStore),
    ) -> Result<(), ConnectionError> {
        let mut store = self.lock().map_err(|_| ConnectionError::StorePoisoned)?;
        work(&mut *store);
        Ok(())
    }

    fn background(&self) {
        if let Ok(mut store) = self.lock() {
            store.background();
        }
    }
}

/// Where the pages of an export of `page_count` pages live across `engines` engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    pub engines: usize,
    pub page_count: u64,
}

impl ShardLayout {
    pub fn new(engines: usize, page_count: u64) -> ShardLayout {
        assert!(engines >= 1, "at least one engine");
        ShardLayout { engines, page_count }
    }

    /// Pages each engine's address space must hold (the same for all: the largest share).
    pub fn engine_pages(&self) -> u64 {
        self.page_count.div_ceil(CHUNK_PAGES).div_ceil(self.engines as u64) * CHUNK_PAGES
    }

    /// The engine that owns export page `page`, and the page's number there.
    pub fn locate(&self, page: u64) -> (usize, u64) {
        let engines = self.engines as u64;
        let chunk = page / CHUNK_PAGES;
        ((chunk % engines) as usize, (chunk / engines) * CHUNK_PAGES + page % CHUNK_PAGES)
    }
}

/// One store per engine, each behind its own lock; see the module documentation.
pub struct Shards<S> {
    engines: Vec<Mutex<S>>,
    layout: ShardLayout,
    page_bytes: usize,
}

impl<S: PageStore + Send> Shards<S> {
    /// `engines[i]` holds at least `layout.engine_pages()` pages of `page_bytes`.
    pub fn new(engines: Vec<S>, page_count: u64) -> Shards<S> {
        assert!(!engines.is_empty(), "at least one engine");
        let layout = ShardLayout::new(engines.len(), page_count);
        let page_bytes = engines[0].page_bytes();
        for engine in &engines {
            assert_eq!(engine.page_bytes(), page_bytes, "engines disagree on the page size");
            assert!(engine.page_count() >= layout.engine_pages(), "an engine is too small");
        }
        Shards { engines: engines.into_iter().map(Mutex::new).collect(), layout, page_bytes }
    }

    /// The engines' stores, for the caller's checks after serving.
    pub fn into_inner(self) -> Vec<S> {
        self.engines
            .into_iter()
            .map(|engine| engine.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner()))
            .collect()
    }
}

impl<S: PageStore + Send> SharedStore for Shards<S> {
    fn with_store(
        &self,
        connection: u64,
        work: &mut dyn FnMut(&mut dyn PageStore),
    ) -> Result<(), ConnectionError> {
        let first = (connection % self.engines.len() as u64) as usize;
        work(&mut Router { shards: self, first });
        Ok(())
    }

    fn background(&self) {
        for engine in &self.engines {
            lock(engine).background();
        }
    }
}

/// A connection's view of the engines for one batch: a [`PageStore`] over the whole export.
struct Router<'s, S> {
    shards: &'s Shards<S>,
    /// The engine this connection tries first.
    first: usize,
}

/// Runs one engine's part of a batch, reporting each op under its index in the whole batch.
fn run_part<S: PageStore>(
    store: &mut S,
    part: &mut Vec<PageOp<'_>>,
    origins: &[usize],
    on_done: &mut dyn FnMut(OpDone),
) {
    store.execute(part, &mut |done| on_done(OpDone { index: origins[done.index], ..done }));
    part.clear();
}

/// `op` on page `page` of its engine, borrowing `op`'s buffer.
fn local_op<'o>(op: &'o mut PageOp<'_>, local: u64) -> PageOp<'o> {
    match op {
        PageOp::Write { data, .. } => PageOp::Write { page: local, data },
        PageOp::WriteData { data, .. } => PageOp::WriteData { page: local, data },
        PageOp::WriteParity { data, .. } => PageOp::WriteParity { page: local, data },
        PageOp::Read { buf, .. } => PageOp::Read { page: local, buf },
        PageOp::Probe { probe } => PageOp::Probe { probe: *probe },
    }
}

fn page_of(op: &PageOp<'_>) -> u64 {
    match op {
        PageOp::Write { page, .. }
        | PageOp::WriteData { page, .. }
        | PageOp::WriteParity { page, .. }
        | PageOp::Read { page, .. } => *page,
        // Probes measure the transport; the first engine's serves.
        PageOp::Probe { .. } => 0,
    }
}

impl<S: PageStore + Send> PageStore for Router<'_, S> {
    fn page_bytes(&self) -> usize {
        self.shards.page_bytes
    }

    fn page_count(&self) -> u64 {
        self.shards.layout.page_count
    }

    /// Each engine runs its part of the batch in batch order, so ops on one page (always one
    /// engine's) keep their order. Allocates the parts once per batch (two vectors per engine), never per page.
    fn execute(&mut self, ops: &mut [PageOp<'_>], on_done: &mut dyn FnMut(OpDone)) {
        let engines = self.shards.engines.len();
        let layout = self.shards.layout;
        // Sized once for the whole batch: no part grows while ops are dealt.
        let mut parts: Vec<(Vec<PageOp<'_>>, Vec<usize>)> =
            (0..engines).map(|_| (Vec::with_capacity(ops.len()), Vec::with_capacity(ops.len()))).collect();
        for (index, op) in ops.iter_mut().enumerate() {
            let (engine, local) = layout.locate(page_of(op));
            parts[engine].0.push(local_op(op, local));
            parts[engine].1.push(index);
        }
        let mut left = parts.iter().filter(|(part, _)| !part.is_empty()).count();
        while left > 0 {
            let mut ran = false;
            for step in 0..engines {
                let engine = (self.first + step) % engines;
                let (part, origins) = &mut parts[engine];
                if part.is_empty() {
                    continue;
                }
                let mut store = match self.shards.engines[engine].try_lock() {
                    Ok(store) => store,
                    Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                    Err(TryLockError::WouldBlock) => continue,
                };
                run_part(&mut *store, part, origins, on_done);
                left -= 1;
                ran = true;
            }
            if !ran {
                // Every engine this batch still needs is busy: wait for the first of them.
                let engine = (0..engines)
                    .map(|step| (self.first + step) % engines)
                    .find(|&engine| !parts[engine].0.is_empty())
                    .expect("a part is left");
                let (part, origins) = &mut parts[engine];
                run_part(&mut *lock(&self.shards.engines[engine]), part, origins, on_done);
                left -= 1;
            }
        }
    }

    fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        if page >= self.shards.layout.page_count {
            return Err(PageError::OutOfRange { page, page_count: self.shards.layout.page_count });
        }
        let (engine, local) = self.shards.layout.locate(page);
        lock(&self.shards.engines[engine]).discard_page(local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn every_page_has_one_place_within_its_engine() {
        for engines in 1..=4 {
            for page_count in [1, 31, 32, 33, 64, 100, 1000, 4097] {
                let layout = ShardLayout::new(engines, page_count);
                let mut seen = std::collections::HashSet::new();
                for page in 0..page_count {
                    let (engine, local) = layout.locate(page);
                    assert!(engine < engines && local < layout.engine_pages(), "{layout:?} page {page}");
                    assert!(seen.insert((engine, local)), "{layout:?}: page {page} shares its place");
                }
                // Chunks alternate: consecutive chunks go to consecutive engines.
                if page_count > CHUNK_PAGES {
                    assert_eq!(layout.locate(CHUNK_PAGES).0, 1 % engines);
                }
            }
        }
    }

    #[test]
    fn a_batch_lands_on_the_owning_engines_and_reports_its_own_indices() {
        let page_count = 200;
        let layout = ShardLayout::new(2, page_count);
        let engines = (0..2).map(|_| MemoryStore::new(8, layout.engine_pages())).collect();
        let shards = Shards::new(engines, page_count);
        let pages: Vec<u64> = vec![0, 31, 32, 63, 64, 199, 5, 40];
        let data: Vec<[u8; 8]> = pages.iter().map(|page| [*page as u8; 8]).collect();
        let mut writes: Vec<PageOp<'_>> =
            pages.iter().zip(&data).map(|(page, data)| PageOp::Write { page: *page, data }).collect();
        let mut done = vec![false; pages.len()];
        shards
            .with_store(1, &mut |store| {
                store.execute(&mut writes, &mut |finished| {
                    assert!(finished.result.is_ok());
                    assert!(!std::mem::replace(&mut done[finished.index], true), "reported twice");
                })
            })
            .unwrap();
        assert!(done.iter().all(|done| *done));
        let mut bufs = vec![[0u8; 8]; pages.len()];
        let mut reads: Vec<PageOp<'_>> =
            pages.iter().zip(bufs.iter_mut()).map(|(page, buf)| PageOp::Read { page: *page, buf }).collect();
        shards.with_store(0, &mut |store| store.execute(&mut reads, &mut |_| {})).unwrap();
        drop(reads);
        assert_eq!(bufs, data);
        shards.with_store(0, &mut |store| store.discard_page(64).unwrap()).unwrap();
        let stores = shards.into_inner();
        // Pages 0-31 and 64-95 are engine 0's (its pages 0-31, 32-63), 32-63 engine 1's.
        assert_eq!(stores[0].pages.len() + stores[1].pages.len(), pages.len() - 1);
        assert_eq!(stores[0].pages[&31], [31u8; 8]);
        assert_eq!(stores[1].pages[&0], [32u8; 8]);
        assert!(!stores[0].pages.contains_key(&32), "page 64 was discarded");
        // Page 199 is in chunk 6: engine 0's local chunk 3.
        assert_eq!(stores[0].pages[&(3 * 32 + 7)], [199u8; 8]);
        assert_eq!(stores[1].pages[&8], [40u8; 8]);
    }
}
