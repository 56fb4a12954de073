//! What the cache needs of its page client, as one trait: start page ops tagged with the op
//! slot's index, let the client advance (its sockets readable, a deadline passed), take the ops
//! that finished, map and give back ranges of the lazily mapped regions, ask the engine about
//! pages and ranges, and read the time.
//!
//! Two implementations: [`PollClient`] (the real client in the server's mio loop: this file's
//! impl only forwards, so the data path costs what it cost before the trait) and, in
//! crates/simnet's tests, an adapter that runs the same engine against simulated nodes in
//! simulated time, so a seed replays a run of the cache exactly.
//!
//! Invariant: everything the cache decides from the time (expiry, the hotness policy's windows,
//! growth retries, transition durations, `uptime`) reads it through [`PageClient::now`] and
//! [`PageClient::now_unix`], never the wall clock directly: under the simulator the same seed
//! gives the same run.

use std::fmt::Display;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use remem_client::engine::{Engine, OpBuffers, OpDone};
use remem_client::{ConnectError, PollClient, SlabMapFile, Submit};

/// The page client of a [`crate::Cache`]. Read buffers stay the cache's (`OpBuffers`, named by
/// tag) and are handed in on every call that may complete a read.
pub trait PageClient {
    /// Why a range could not be mapped.
    type MapError: Display;

    /// Starts an op tagged `tag`, its frames left for the next [`PageClient::on_readable`] or
    /// [`PageClient::on_timer`]. False when it cannot start now (every op slot busy, or an op
    /// on the same page in flight): submit it again after a completion.
    fn submit_unflushed(&mut self, tag: usize, op: Submit<'_>, buffers: &mut dyn OpBuffers) -> bool;

    /// Replies may have arrived: take every one that is there, without blocking, and advance.
    fn on_readable(&mut self, buffers: &mut dyn OpBuffers);

    /// The deadline passed (or any time): heartbeats, op deadlines, probes, rebuilds.
    fn on_timer(&mut self, buffers: &mut dyn OpBuffers);

    /// Ops completed since the last call, in completion order.
    fn completions(&mut self) -> impl Iterator<Item = OpDone> + '_;

    /// Ops in flight.
    fn in_flight(&self) -> usize;

    /// When [`PageClient::on_timer`] must run at the latest.
    fn next_deadline(&self) -> Option<Instant>;

    /// The engine (read only: ranges, slots, page states, status). `&mut self` because the
    /// poll driver lends its client only mutably.
    fn engine(&mut self) -> &Engine;

    /// Maps range `range`, which has no slabs, running the client until the nodes answered;
    /// ops that complete meanwhile wait for [`PageClient::completions`]. Nothing stays mapped
    /// on an error.
    fn map_range(&mut self, range: usize, buffers: &mut dyn OpBuffers) -> Result<(), Self::MapError>;

    /// Gives range `range` back; false, with nothing done, while an op or a rebuild is on it.
    fn release_range(&mut self, range: usize) -> bool;

    /// The slab map to save after the mapped ranges changed; `None` for a client whose map
    /// is kept elsewhere (the simulator's driver keeps its own).
    fn slab_map(&mut self) -> Option<SlabMapFile>;

    /// Ranges that have their slabs, of every region.
    fn mapped_range_count(&mut self) -> usize;

    /// Node memory the client's slabs take now.
    fn mapped_node_bytes(&mut self) -> u64;

    /// Waits until the client may have something to do (replies readable or its deadline),
    /// at most `longest`. For the few blocking paths of the cache (the state region's writes).
    fn wait_for_io(&mut self, longest: Duration);

    /// The client's monotonic time: the engine's clock.
    fn now(&self) -> Instant;

    /// The wall clock in unix seconds (expiry, hotness windows, `stats` time).
    fn now_unix(&self) -> u64;
}

impl PageClient for PollClient {
    type MapError = ConnectError;

    fn submit_unflushed(&mut self, tag: usize, op: Submit<'_>, buffers: &mut dyn OpBuffers) -> bool {
        PollClient::submit_unflushed(self, tag, op, buffers)
    }

    fn on_readable(&mut self, buffers: &mut dyn OpBuffers) {
        PollClient::on_readable(self, buffers);
    }

    fn on_timer(&mut self, buffers: &mut dyn OpBuffers) {
        PollClient::on_timer(self, buffers);
    }

    fn completions(&mut self) -> impl Iterator<Item = OpDone> + '_ {
        PollClient::completions(self)
    }

    fn in_flight(&self) -> usize {
        PollClient::in_flight(self)
    }

    fn next_deadline(&self) -> Option<Instant> {
        PollClient::next_deadline(self)
    }

    fn engine(&mut self) -> &Engine {
        self.client().engine()
    }

    fn map_range(&mut self, range: usize, buffers: &mut dyn OpBuffers) -> Result<(), ConnectError> {
        self.client().map_range(range, buffers)
    }

    fn release_range(&mut self, range: usize) -> bool {
        self.client().release_range(range)
    }

    fn slab_map(&mut self) -> Option<SlabMapFile> {
        Some(self.client().slab_map())
    }

    fn mapped_range_count(&mut self) -> usize {
        self.client().mapped_range_count()
    }

    fn mapped_node_bytes(&mut self) -> u64 {
        self.client().mapped_node_bytes()
    }

    fn wait_for_io(&mut self, longest: Duration) {
        let now = Instant::now();
        let until = self.next_deadline().map_or(longest, |deadline| deadline.saturating_duration_since(now));
        let timeout_ms = until.min(longest).as_millis() as i32;
        let mut poll_fd = libc::pollfd { fd: self.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, owned by this frame, for the duration of the call.
        unsafe { libc::poll(&mut poll_fd, 1, timeout_ms) };
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn now_unix(&self) -> u64 {
        crate::clock::now_unix()
    }
}
