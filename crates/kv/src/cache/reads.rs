//! Reading values: one fetch per location (gets of a value being fetched wait for it), the
//! EOR main copy first and its data splits when it fails (with read repair of the main copy),
//! values answered from a store still in flight (data bypassing), and delivery to the waiter.

use super::{Cache, Fetch, Task, Waiter, FALLBACK, MAIN, PART_MASK, REPAIR_TASK, TAIL};
use crate::completion::{Completion, Fetched};
use crate::error::ValueError;
use crate::index::{EntryId, LocationId, Released};
use crate::page_client::PageClient;
use crate::pageio::{IoDone, IoKind, IoOwner, TaskId};
use crate::scheme::Scheme;
use crate::space::PAGE_BYTES;

impl<P: PageClient> Cache<P> {
    // ---- fetching a value ---------------------------------------------------------------

    /// Reads the value at `location` for `waiter`, sharing a fetch already in flight.
    pub fn fetch(&mut self, key: &[u8], location: LocationId, waiter: Waiter) {
        if self.config.bypass {
            if let Some(&task) = self.fetch_of_location.get(&location) {
                if let Some(Task::Fetch(fetch)) = self.tasks.get_mut(&task) {
                    fetch.waiters.push(waiter);
                    self.stats.shared_fetches += 1;
                    return;
                }
            }
        }
        self.index.retain(location);
        let (scheme, extent, value_bytes) = {
            let location = self.index.location(location);
            (location.scheme, location.extent.clone(), location.value_bytes)
        };
        let task = self.new_task_id();
        let mut fetch = Fetch {
            key: key.into(),
            location,
            scheme,
            // Made where it is delivered from: an `Rc<[u8]>` from a `Vec` would copy it again.
            value: std::iter::repeat_n(0, value_bytes).collect(),
            outstanding: 0,
            error: None,
            waiters: vec![waiter],
            shared: self.config.bypass,
            from_data_splits: false,
        };
        let mut reads = Vec::new();
        for (index, &page) in extent.pages.iter().enumerate() {
            let (source, part) = self.read_source(scheme, page);
            reads.push((source, index as u32 | part));
        }
        if let Some(chunk) = extent.tail {
            let start = extent.pages.len() * PAGE_BYTES;
            let len = value_bytes - start;
            if let Some(bytes) = self.chunks.bytes(chunk.page) {
                fetch.value_mut()[start..].copy_from_slice(&bytes[chunk.offset()..chunk.offset() + len]);
            } else {
                let (source, part) = self.read_source(scheme, chunk.page);
                reads.push((source, TAIL | part));
            }
        }
        fetch.outstanding = reads.len() as u32;
        self.stats.bytes_read_remote += (reads.len() * PAGE_BYTES) as u64;
        let outstanding = fetch.outstanding;
        self.tasks.insert(task, Task::Fetch(fetch));
        if self.config.bypass {
            self.fetch_of_location.insert(location, task);
        }
        for (page, part) in reads {
            self.io.read(&mut self.client, page, IoOwner { task, part });
        }
        if outstanding == 0 {
            self.finish_fetch(task);
        }
    }

    pub(super) fn fetch_done(&mut self, task: TaskId, done: &mut IoDone) {
        let (scheme, location_id) = match self.tasks.get(&task) {
            Some(Task::Fetch(fetch)) => (fetch.scheme, fetch.location),
            _ => return,
        };
        let part = done.owner.part;
        let index = part & PART_MASK;
        let page = {
            let extent = &self.index.location(location_id).extent;
            if index == TAIL {
                extent.tail.expect("a tail part has a tail").page
            } else {
                extent.pages[index as usize]
            }
        };
        let mut error = None;
        match &done.result {
            Ok(()) => {
                // Missing data splits, or an EOR main copy that could not serve: not a parity
                // that merely answered first.
                if done.degraded || part & FALLBACK != 0 {
                    self.stats.degraded_reads += 1;
                }
                if scheme == Scheme::Eor && index != TAIL {
                    self.repair_eor_page(page, part, done.slot);
                }
                if scheme == Scheme::Eor && index == TAIL && part & FALLBACK != 0 {
                    self.repair_eor_chunk_page(location_id, done.slot);
                }
                let Some(Task::Fetch(fetch)) = self.tasks.get_mut(&task) else { return };
                let extent = &self.index.location(location_id).extent;
                let bytes = self.io.buffer(done.slot);
                if index == TAIL {
                    let chunk = extent.tail.expect("a tail part has a tail");
                    let start = extent.pages.len() * PAGE_BYTES;
                    let len = fetch.value.len() - start;
                    fetch.value_mut()[start..].copy_from_slice(&bytes[chunk.offset()..chunk.offset() + len]);
                } else {
                    let start = index as usize * PAGE_BYTES;
                    let end = (start + PAGE_BYTES).min(fetch.value.len());
                    fetch.value_mut()[start..end].copy_from_slice(&bytes[..end - start]);
                }
            }
            Err(error) if part & MAIN != 0 => {
                // The EOR main copy is gone: read the redundant replica (the data splits).
                tracing::debug!(%error, "EOR main copy unreadable; reading the data splits");
                self.io.read(&mut self.client, page, IoOwner { task, part: index | FALLBACK });
                return;
            }
            Err(_) => error = ValueError::take_page(&mut done.result),
        }
        let Some(Task::Fetch(fetch)) = self.tasks.get_mut(&task) else { return };
        if fetch.error.is_none() {
            fetch.error = error;
        }
        fetch.outstanding -= 1;
        if fetch.outstanding == 0 {
            self.finish_fetch(task);
        }
    }

    /// Read repair of a whole EOR page: one half of it was lost with a node and the other half
    /// was just read (in `slot`): write the lost half back, so the next failure is survived.
    /// (Chunk pages are written only through the chunk cache and are not repaired here.)
    fn repair_eor_page(&mut self, page: u64, part: u32, slot: usize) {
        let repair = if part & MAIN != 0 && self.client.engine().page_is_unreadable(page) {
            Some((IoKind::WriteData, page, 0))
        } else if part & FALLBACK != 0 {
            Some((IoKind::Write, self.main_page(page), MAIN))
        } else {
            None
        };
        if let Some((kind, target, part)) = repair {
            let data = self.io.buffer(slot).to_vec();
            self.stats.repairs += 1;
            self.io.write(&mut self.client, kind, target, &data, IoOwner { task: REPAIR_TASK, part });
        }
    }

    /// Reads every page of an EOR fetch again from the data splits (the main copy's bytes did
    /// not match the value's restored record). Tails in the chunk cache are taken from there.
    fn refetch_from_data_splits(&mut self, task: TaskId, mut fetch: Fetch) {
        let extent = self.index.location(fetch.location).extent.clone();
        let mut reads: Vec<(u64, u32)> =
            extent.pages.iter().enumerate().map(|(index, &page)| (page, index as u32 | FALLBACK)).collect();
        if let Some(chunk) = extent.tail {
            let start = extent.pages.len() * PAGE_BYTES;
            match self.chunks.bytes(chunk.page) {
                Some(bytes) => {
                    let len = fetch.value.len() - start;
                    fetch.value_mut()[start..].copy_from_slice(&bytes[chunk.offset()..chunk.offset() + len]);
                }
                None => reads.push((chunk.page, TAIL | FALLBACK)),
            }
        }
        fetch.from_data_splits = true;
        fetch.outstanding = reads.len() as u32;
        self.stats.bytes_read_remote += (reads.len() * PAGE_BYTES) as u64;
        let outstanding = fetch.outstanding;
        self.tasks.insert(task, Task::Fetch(fetch));
        for (page, part) in reads {
            self.io.read(&mut self.client, page, IoOwner { task, part });
        }
        if outstanding == 0 {
            self.finish_fetch(task);
        }
    }

    fn finish_fetch(&mut self, task: TaskId) {
        let Some(Task::Fetch(fetch)) = self.tasks.remove(&task) else { return };
        let place = self.index.location(fetch.location);
        let mismatch = fetch.error.is_none()
            && place.verify
            && crate::index::item_crc(&fetch.key, &fetch.value) != place.value_crc;
        if mismatch && fetch.scheme == Scheme::Eor && !fetch.from_data_splits {
            tracing::info!(
                key = %String::from_utf8_lossy(&fetch.key),
                "a restored EOR value's main copy does not match its record: reading its data splits"
            );
            return self.refetch_from_data_splits(task, fetch);
        }
        if fetch.shared {
            self.fetch_of_location.remove(&fetch.location);
        }
        let mut value: Fetched = match fetch.error {
            None => Ok(fetch.value),
            Some(error) => Err(error),
        };
        let place = self.index.location(fetch.location);
        if let (Ok(_), true) = (&value, place.verify) {
            // The first read of a restored value: its bytes must be the ones its record names.
            if !mismatch {
                self.index.mark_verified(fetch.location);
            } else {
                self.stats.restored_mismatches += 1;
                tracing::warn!(key = %String::from_utf8_lossy(&fetch.key), "a restored value does not match its record's checksum: dropped");
                value = Err(ValueError::RestoredChecksumMismatch);
            }
        }
        if value.is_err() {
            self.stats.lost_reads += 1;
            // The value is gone (more failures than its scheme survives): the entry goes, so
            // the next get is a miss that the application refills.
            if let Some(id) = self.index.find(&fetch.key) {
                if self.index.entry(id).location == fetch.location {
                    self.remove_entry(id);
                }
            }
        }
        let mut released = Released::new();
        self.index.release(fetch.location, &mut released);
        self.free(released);
        for waiter in fetch.waiters {
            self.deliver(waiter, value.clone());
        }
    }

    /// Gives an entry's value to a waiter: from its write in flight (bypassing), after that write
    /// (bypassing off), or by a fetch.
    pub fn read_entry(&mut self, id: EntryId, waiter: Waiter, now: u64) {
        self.index.touch_lru(id);
        let entry = self.index.entry_mut(id);
        entry.fetched = true;
        let (pending, location, key) = (entry.pending, entry.location, entry.key.clone());
        self.count_read(id, now);
        if let Some(task) = pending {
            if let Some(Task::Store(store)) = self.tasks.get_mut(&task) {
                if self.config.bypass {
                    let value = store.value.clone();
                    self.stats.bypassed_gets += 1;
                    self.deliver(waiter, Ok(value));
                } else {
                    store.after.push(waiter);
                }
                return;
            }
        }
        self.fetch(&key, location, waiter);
    }

    /// Hands a fetched value (or why it could not be read) to one waiter.
    pub fn deliver(&mut self, waiter: Waiter, value: Fetched) {
        match waiter {
            Waiter::Get { conn, seq, render, end, reserved } => {
                self.completions.push_back(Completion::Value { conn, seq, render, end, reserved, value });
            }
            Waiter::Rmw { key } => self.completions.push_back(Completion::RmwValue { key, value }),
            Waiter::Transition { task } => self.transition_fetched(task, value),
            Waiter::Scrub => self.stats.scrub_reads += 1,
        }
    }
}
