//! Flat combining: one lock over a state, and a queue of items for whoever holds it.
//!
//! A thread with an item for the state queues it and tries the lock; whoever holds the lock
//! runs every queued item (as one batch: `Combine::run`), so a thread that finds the lock busy
//! returns at once and its item rides with the next batch. The lock is never given up with an
//! item stranded in the queue: after each unlock the thread that unlocked looks at the queue
//! again and runs it if the lock is free, and a thread that queues tries the lock after
//! queueing. One of the two always sees the other (sequentially consistent fences between the
//! queue and the lock on both sides, as in Dekker's algorithm), so every queued item is run by
//! some holder before the last holder's guard is gone.
//!
//! Order: items run in the order they were queued; `lock` runs the queue before it hands out
//! the state, so a change made under the lock comes after every item queued before it.
//!
//! A panic under the lock poisons nothing here: the state is taken as it is (the caller decides
//! what a half-done item means; for the file system a reply never sent is `EIO` from fuser).

use std::sync::atomic::{fence, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// A state that runs queued items.
pub(crate) trait Combine: Send {
    type Item: Send;
    /// Runs `items` (in arrival order) and leaves the vector empty.
    fn run(&mut self, items: &mut Vec<Self::Item>);
}

struct Locked<T: Combine> {
    state: T,
    /// The vector swapped with the queue's to take its items: both keep their allocations.
    spare: Vec<T::Item>,
}

pub(crate) struct Combining<T: Combine> {
    locked: Mutex<Locked<T>>,
    queue: Mutex<Vec<T::Item>>,
}

/// The state, locked. Dropping it unlocks, then runs what was queued meanwhile.
pub(crate) struct Guard<'a, T: Combine> {
    combining: &'a Combining<T>,
    locked: Option<MutexGuard<'a, Locked<T>>>,
}

fn unpoisoned<G>(result: Result<G, std::sync::PoisonError<G>>) -> G {
    result.unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<T: Combine> Combining<T> {
    pub(crate) fn new(state: T) -> Combining<T> {
        Combining { locked: Mutex::new(Locked { state, spare: Vec::new() }), queue: Mutex::new(Vec::new()) }
    }

    /// Waits for the lock, runs the items queued so far, and returns the state.
    pub(crate) fn lock(&self) -> Guard<'_, T> {
        let mut locked = unpoisoned(self.locked.lock());
        self.run_queued(&mut locked);
        Guard { combining: self, locked: Some(locked) }
    }

    /// The state if the lock is free, without running the queue: the caller runs it with
    /// [`Guard::with_queued`] (or dropping the guard does).
    pub(crate) fn try_lock(&self) -> Option<Guard<'_, T>> {
        let locked = match self.locked.try_lock() {
            Ok(locked) => locked,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(Guard { combining: self, locked: Some(locked) })
    }

    /// Queues `item`, and runs the queue if the lock is free; otherwise returns at once and
    /// the holder runs it.
    pub(crate) fn submit(&self, item: T::Item) {
        unpoisoned(self.queue.lock()).push(item);
        self.run_stranded();
    }

    /// Until the queue is empty or the lock busy (its holder looks again after unlocking):
    /// take the lock and run the queue.
    fn run_stranded(&self) {
        loop {
            // Pairs with the same fence of a thread that queues or unlocks (module docs).
            fence(Ordering::SeqCst);
            if unpoisoned(self.queue.lock()).is_empty() {
                return;
            }
            let Some(mut guard) = self.try_lock() else { return };
            let locked = guard.locked.as_mut().expect("held until drop");
            self.run_queued(locked);
            // Unlock without the guard's drop (this loop is that drop's work).
            drop(guard.locked.take());
        }
    }

    fn run_queued(&self, locked: &mut Locked<T>) {
        let mut items = std::mem::take(&mut locked.spare);
        std::mem::swap(&mut *unpoisoned(self.queue.lock()), &mut items);
        if !items.is_empty() {
            locked.state.run(&mut items);
            items.clear();
        }
        locked.spare = items;
    }
}

impl<T: Combine> Guard<'_, T> {
    /// Calls `run(state, queued)` with the items queued so far (they came before anything
    /// the caller adds to them); whatever `run` leaves in the vector is dropped.
    pub(crate) fn with_queued<R>(&mut self, run: impl FnOnce(&mut T, &mut Vec<T::Item>) -> R) -> R {
        let locked = self.locked.as_mut().expect("held until drop");
        let mut items = std::mem::take(&mut locked.spare);
        std::mem::swap(&mut *unpoisoned(self.combining.queue.lock()), &mut items);
        let result = run(&mut locked.state, &mut items);
        items.clear();
        locked.spare = items;
        result
    }
}

impl<T: Combine> std::ops::Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.locked.as_ref().expect("held until drop").state
    }
}

impl<T: Combine> std::ops::DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.locked.as_mut().expect("held until drop").state
    }
}

impl<T: Combine> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        if self.locked.take().is_some() {
            self.combining.run_stranded();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Records what it ran, and how many batches.
    #[derive(Default)]
    struct Recorder {
        seen: Vec<(usize, usize)>,
        batches: usize,
    }

    impl Combine for Recorder {
        type Item = (usize, usize);
        fn run(&mut self, items: &mut Vec<(usize, usize)>) {
            self.batches += 1;
            // A slow batch, so that others queue meanwhile.
            std::thread::sleep(std::time::Duration::from_micros(20));
            self.seen.append(items);
        }
    }

    #[test]
    fn every_item_submitted_by_eight_threads_runs_once_in_each_threads_order() {
        const THREADS: usize = 8;
        const ITEMS: usize = 2_000;
        let combining = Arc::new(Combining::new(Recorder::default()));
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let combining = Arc::clone(&combining);
                std::thread::spawn(move || {
                    for item in 0..ITEMS {
                        combining.submit((thread, item));
                        if item % 97 == 0 {
                            // Sometimes a change under the lock, as the metadata requests do.
                            let _guard = combining.lock();
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("submitter");
        }
        // No flush: whatever was queued has been run by the time every submitter returned.
        let guard = combining.try_lock().expect("nobody holds it");
        assert_eq!(guard.seen.len(), THREADS * ITEMS, "every item ran once");
        let mut next = [0; THREADS];
        for &(thread, item) in &guard.seen {
            assert_eq!(item, next[thread], "thread {thread}'s items in the order it queued them");
            next[thread] += 1;
        }
        assert!(guard.batches < THREADS * ITEMS, "some items shared a batch ({} batches)", guard.batches);
    }

    #[test]
    fn lock_runs_the_queue_first_and_with_queued_hands_it_over() {
        let combining = Combining::new(Recorder::default());
        let mut guard = combining.try_lock().expect("free");
        // Queued while the lock is held: it waits for the holder.
        std::thread::scope(|scope| {
            scope.spawn(|| combining.submit((1, 0)));
        });
        let handed = guard.with_queued(|_, queued| queued.clone());
        assert_eq!(handed, vec![(1, 0)]);
        assert!(guard.seen.is_empty(), "handed over, not run");
        drop(guard);
        std::thread::scope(|scope| {
            let held = combining.lock();
            scope.spawn(|| combining.submit((2, 0)));
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(held.seen.is_empty());
            drop(held);
        });
        let guard = combining.lock();
        assert_eq!(guard.seen, vec![(2, 0)], "the holder's drop ran what came meanwhile");
    }
}
