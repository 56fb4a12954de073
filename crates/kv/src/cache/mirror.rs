//! The kv's own state in remote memory (`remem kv --etcd`, docs/KV.md "Host loss"): the backup
//! region and the rewrites log copied into a remem region of the cache's client, the **state
//! region**, so that a `remem kv` on another host rebuilds the index from it.
//!
//! The working copy stays local (the backup region's mapped file, the rewrites file); the
//! durable copy is the state region: page 0 holds the rewrites log, page 1 + i page i of the
//! backup region. Before replies leave (`Cache::durability_barrier`, once per pass of the
//! event loop: group commit), every page changed since the last pass is written whole from the
//! working copy, and the replies wait until each write is done. An intent of the rewrites log is
//! written (blocking) before its page is rewritten in place, and its clearing before its
//! journal slot is used again.
//!
//! **Why a replicated region, rep(r+1).** Pages of the state region are rewritten in place, and
//! a kill in the middle of a write reaches some of a page's splits and not others. An EC page
//! cut that way can keep fewer than k splits of either version: unreadable with no node down,
//! and every record acknowledged earlier on that page lost. Each copy of a replicated page is
//! the whole page: a cut write leaves some copies new and some old, each one a valid state of
//! the page (the old is the state of the last pass, whose replies were sent; the new one's
//! replies were not), and a read takes any one. rep(r+1) survives r lost nodes, as the values'
//! EC(k,r) does; it costs r+1 times the pages in use (records, about 100 bytes per item) where
//! a ping-pong scheme over EC would cost 2(k+r)/k and a version word per page to choose by.
//!
//! **Across pages**, the copy-out of one pass is not atomic either, so the order of changes
//! between pages is kept by phases: the pages changed by new records go first, and the frees
//! they allow (an update's old record) are applied and written only after those are done
//! (`crate::backup` `dirty.rs` has the argument).
//!
//! **Places are reused only once no record names them there.** Locally a record is freed
//! before its pages are; here the free reaches the state region at the next copy-out, so the
//! pages (and chunks) of a freed record are given back to the allocator only after it: a value
//! written into them earlier, then a kill, would leave the old record naming another value's
//! bytes (refused by its checksum at the first read, but the item lost, though an update of it
//! was in flight and the old value acknowledged). `Cache::free` runs a copy-out first when frees
//! are held back (so an update or a delete costs its round of writes when it completes, and the
//! pass's own copy-out finds less to do).
//!
//! A failed copy-out (more than r nodes of a page's copies gone) fails the barrier: the server
//! stops rather than send replies a restart could not honour.

use std::time::Duration;

use remem_client::PageError;

use super::Cache;
use crate::backup::Slot;
use crate::page_client::PageClient;
use crate::pageio::{IoDone, IoKind, IoOwner, TaskId};

/// The owner of the state region's writes (no task of the work table has this id).
pub const STATE_TASK: TaskId = TaskId::MAX;

/// Longest wait for the client's sockets in one turn while state writes are in flight (the
/// engine's own deadlines, op timeouts and heartbeats, come sooner when due).
const WAIT_SLICE: Duration = Duration::from_millis(5);

/// Where the state region lies in the client's page space.
#[derive(Clone, Copy, Debug)]
pub struct StateRegion {
    pub first_page: u64,
    pub page_count: u64,
    /// The client's index of its first range.
    pub first_range: usize,
    pub pages_per_range: u64,
}

/// The copy-out's state; buffers are kept between passes (no allocation per request).
#[derive(Debug)]
pub struct StateMirror {
    region: StateRegion,
    pages: Vec<u64>,
    frees: Vec<Slot>,
    done: Vec<IoDone>,
    /// Completions of the cache's own ops that arrived while state writes were awaited: the
    /// next engine call hands them on.
    pub(crate) deferred: Vec<IoDone>,
    /// Pages written, for `stats`.
    pub pages_written: u64,
    pub barriers: u64,
}

impl StateMirror {
    pub fn new(region: StateRegion) -> StateMirror {
        StateMirror {
            region,
            pages: Vec::new(),
            frees: Vec::new(),
            done: Vec::new(),
            deferred: Vec::new(),
            pages_written: 0,
            barriers: 0,
        }
    }
}

/// A read error of the state region, in words that say which failure it was: a page torn by a
/// write cut short (every node answered, no k splits agree: with replicated pages only by
/// damage) or lost with more nodes than the region survives.
pub fn describe_read_error(state_page: u64, error: &PageError) -> String {
    match error {
        PageError::Lost { failed_nodes, .. } if failed_nodes.is_empty() => {
            format!("state page {state_page} is torn: every node answered and no copy is whole ({error})")
        }
        PageError::Lost { failed_nodes, .. } => format!(
            "state page {state_page} is lost with nodes {failed_nodes:?}: more nodes failed than the state \
             region survives ({error})"
        ),
        other => format!("state page {state_page}: {other}"),
    }
}

impl<P: PageClient> Cache<P> {
    /// Copies the backup region and the rewrites log to the state region from now on.
    pub fn set_state_mirror(&mut self, region: StateRegion) {
        self.mirror = Some(StateMirror::new(region));
    }

    pub fn state_mirror(&self) -> Option<&StateMirror> {
        self.mirror.as_ref()
    }

    /// Before replies leave: the standby's barrier, and the state region brought up to date
    /// (new records first, then the frees they allow). Errors when a copy-out failed: the
    /// replies must not be sent.
    pub fn durability_barrier(&mut self) -> Result<(), String> {
        let Some(backup) = self.backup.as_mut() else { return Ok(()) };
        backup.barrier();
        let Some(mirror) = self.mirror.as_mut() else { return Ok(()) };
        if backup.is_clean() {
            return Ok(());
        }
        mirror.barriers += 1;
        let mut pages = std::mem::take(&mut mirror.pages);
        let mut frees = std::mem::take(&mut mirror.frees);
        backup.take_dirty_pages(&mut pages);
        let mut result = self.write_state(&pages, false);
        pages.clear();
        if result.is_ok() {
            let backup = self.backup.as_mut().expect("checked above");
            backup.apply_deferred_frees(&mut frees);
            backup.take_dirty_pages(&mut pages);
            result = self.write_state(&pages, false);
            pages.clear();
        }
        let mirror = self.mirror.as_mut().expect("checked above");
        (mirror.pages, mirror.frees) = (pages, frees);
        result
    }

    /// Writes the rewrites log's page now (blocking): an intent must be in the state region
    /// before its page is written in place, and its clearing before its slot is used again.
    pub fn persist_rewrites(&mut self) -> Result<(), String> {
        if self.mirror.is_none() {
            return Ok(());
        }
        self.write_state(&[], true)
    }

    /// Writes backup pages `pages` (and the rewrites log's page with `rewrites`) to the state
    /// region and waits for them, mapping (and saving in the slab map) the ranges they need.
    fn write_state(&mut self, pages: &[u64], rewrites: bool) -> Result<(), String> {
        let region = self.mirror.as_ref().expect("a state mirror").region;
        let state_pages = pages.iter().map(|&page| page + 1).chain(rewrites.then_some(0));
        let mut mapped_any = false;
        for state_page in state_pages.clone() {
            assert!(state_page < region.page_count, "state page {state_page} beyond the state region");
            let range = region.first_range + (state_page / region.pages_per_range) as usize;
            if self.client.engine().range_mapped(range) {
                continue;
            }
            let (client, buffers) = (&mut self.client, &mut self.io);
            buffers
                .with_buffers(|buffers| client.map_range(range, buffers))
                .map_err(|error| format!("cannot map a range of the state region: {error}"))?;
            self.growth.collect_now = true;
            mapped_any = true;
        }
        if mapped_any {
            self.save_map().map_err(|error| format!("cannot save the slab map: {error}"))?;
        }
        let mut outstanding = 0;
        for state_page in state_pages {
            let data: &[u8] = match state_page {
                0 => self.rewrites.as_ref().map(|log| &log.bytes()[..]).unwrap_or(&[]),
                page => self.backup.as_ref().expect("a backup region").page_bytes(page - 1),
            };
            let owner = IoOwner { task: STATE_TASK, part: 0 };
            self.io.write(&mut self.client, IoKind::Write, region.first_page + state_page, data, owner);
            outstanding += 1;
        }
        self.wait_state_writes(outstanding)
    }

    /// Drives the client until `outstanding` state writes are done; other ops' completions are
    /// kept for the next engine call.
    fn wait_state_writes(&mut self, mut outstanding: usize) -> Result<(), String> {
        let mirror = self.mirror.as_mut().expect("a state mirror");
        let mut done = std::mem::take(&mut mirror.done);
        let mut first_error = None;
        while outstanding > 0 {
            self.io.start_waiting(&mut self.client);
            self.io.on_timer(&mut self.client, &mut done);
            let mirror = self.mirror.as_mut().expect("a state mirror");
            for op in done.drain(..) {
                if op.owner.task != STATE_TASK {
                    mirror.deferred.push(op);
                    continue;
                }
                outstanding -= 1;
                mirror.pages_written += 1;
                if let Err(error) = &op.result {
                    first_error.get_or_insert_with(|| format!("writing the state region: {error}"));
                }
                self.io.finish(op.slot);
            }
            if outstanding > 0 {
                self.client.wait_for_io(WAIT_SLICE);
            }
        }
        let mirror = self.mirror.as_mut().expect("a state mirror");
        mirror.done = done;
        if !mirror.deferred.is_empty() {
            self.growth.collect_now = true;
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Whether every record freed so far is freed in the state region too, so that the places
    /// they named may be reused: when frees are held back, a copy-out runs now (blocking). False
    /// when it failed: the caller keeps the places unused (the server stops at its next
    /// barrier, which fails as this one did).
    pub(crate) fn state_records_freed(&mut self) -> bool {
        let pending =
            self.mirror.is_some() && self.backup.as_ref().is_some_and(|backup| backup.has_deferred_frees());
        if !pending {
            return true;
        }
        match self.durability_barrier() {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(%error, "the state region could not take a free: its places stay unused");
                false
            }
        }
    }

    /// Completions that arrived while state writes were awaited, for `complete`.
    pub(crate) fn take_deferred(&mut self, done: &mut Vec<IoDone>) {
        if let Some(mirror) = self.mirror.as_mut() {
            done.append(&mut mirror.deferred);
        }
    }
}
