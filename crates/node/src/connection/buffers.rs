//! A connection's buffers, bounded: what a connection may hold, for how long, and node-wide.
//!
//! Fault model: an authenticated client may still be hostile or broken. It may announce a 1 MiB
//! frame and send nothing more, hundreds of times over; it may hold connections open and quiet
//! for ever (clients legitimately do). So:
//! - a connection starts with [`SMALL_INPUT_BYTES`] of input and [`SMALL_OUTPUT_BYTES`] of
//!   output, and grows its input to [`INPUT_BUFFER_BYTES`] only when a read fills it (a busy
//!   client), or to one frame's size when a frame does not fit;
//! - every byte beyond those small buffers is charged to one node-wide [`BufferBudget`]
//!   ([`CONNECTION_BUFFER_BUDGET_BYTES`]). A frame that needs more input than the budget has left
//!   is refused with `NoCapacity` and the connection closed; a busy client that cannot get the
//!   working size keeps reading through the small buffer (slower, never refused). Output grows
//!   only with replies to complete requests and is charged as it grows;
//! - a frame started but not finished within [`PARTIAL_FRAME_TIMEOUT`] closes the connection;
//! - a connection quiet for [`IDLE_SHRINK_AFTER`] with no partial frame gives its buffers back
//!   and waits with the small ones, so idle connections cost 32 KiB each, not megabytes.
//!
//! So the node's connection buffers stay below the budget plus 32 KiB per connection (at most
//! `max_connections` authenticated plus 64 authenticating), whatever clients send.
//!
//! The read timeout doubles as the clock: a connection that holds anything beyond its small
//! buffers, or a partial frame, reads with a timeout of [`IDLE_SHRINK_AFTER`] and looks at its
//! deadlines when it fires; an idle connection with small buffers blocks with the lease timeout
//! if it holds a lease (to close it when its process stopped renewing it, `leases`), else with
//! none. The timeout is set only when that state changes, not per read.

use super::{end_of_io, Connection, ConnectionEnd};
use crate::log_limit::BUFFER_LIMIT_CLOSES;
use remem_proto::ErrorCode;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Input buffer of a busy connection: room for hundreds of pipelined 512-byte writes per `read`.
pub const INPUT_BUFFER_BYTES: usize = 256 * 1024;
/// Input buffer of a new or idle connection; also the largest handshake frame.
pub const SMALL_INPUT_BYTES: usize = 16 * 1024;
/// Output buffer capacity of a new or idle connection.
pub const SMALL_OUTPUT_BYTES: usize = 16 * 1024;
/// Node-wide bytes of connection buffers beyond the small ones.
pub const CONNECTION_BUFFER_BUDGET_BYTES: usize = 64 << 20;
/// A frame whose first byte arrived this long ago and that is still not complete closes its
/// connection.
pub const PARTIAL_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection with nothing buffered and nothing received for this long shrinks its buffers.
pub const IDLE_SHRINK_AFTER: Duration = Duration::from_secs(1);

/// Bytes of connection buffers in use beyond the small ones, node-wide, against a limit.
pub struct BufferBudget {
    used_bytes: AtomicUsize,
    limit_bytes: usize,
}

impl BufferBudget {
    pub fn new(limit_bytes: usize) -> BufferBudget {
        BufferBudget { used_bytes: AtomicUsize::new(0), limit_bytes }
    }

    /// Takes `bytes` if the budget has them.
    fn try_take(&self, bytes: usize) -> bool {
        self.used_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit_bytes)
            })
            .is_ok()
    }

    /// Takes `bytes` even past the limit (output already allocated for replies).
    fn take(&self, bytes: usize) {
        self.used_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn give_back(&self, bytes: usize) {
        let before = self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
        assert!(before >= bytes, "a connection gave back more buffer bytes than it took");
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes.load(Ordering::Relaxed)
    }
}

/// The part of a connection's buffers charged to the budget.
fn chargeable(input_bytes: usize, output_capacity_bytes: usize) -> usize {
    input_bytes.saturating_sub(SMALL_INPUT_BYTES) + output_capacity_bytes.saturating_sub(SMALL_OUTPUT_BYTES)
}

impl Connection {
    /// Grows the input to hold a frame of `frame_bytes`, if the budget allows; else refuses
    /// with `NoCapacity` (the frame's bytes cannot be skipped, so the connection closes).
    pub(super) fn grow_for_frame(
        &mut self,
        request_id: u64,
        frame_bytes: usize,
    ) -> Result<(), ConnectionEnd> {
        if frame_bytes <= self.input.len() {
            return Ok(());
        }
        if !self.try_grow_input(frame_bytes) {
            if BUFFER_LIMIT_CLOSES.allow() {
                tracing::warn!(peer = %self.peer, client_id = self.client_id, frame_bytes,
                    budget_used_bytes = self.shared.buffer_budget.used_bytes(),
                    "connection buffers at their limit: a frame that does not fit is refused, connection closed");
            }
            return Err(self.refuse(
                request_id,
                ErrorCode::NoCapacity,
                format!("a {frame_bytes}-byte frame does not fit: this node's connection buffers are at their limit"),
            ));
        }
        Ok(())
    }

    fn try_grow_input(&mut self, new_bytes: usize) -> bool {
        let extra = chargeable(new_bytes, 0) - chargeable(self.input.len(), 0);
        if !self.shared.buffer_budget.try_take(extra) {
            return false;
        }
        self.input.resize(new_bytes, 0);
        self.charged_bytes += extra;
        true
    }

    /// Charges output that grew with replies since the last look (never refused: the replies
    /// are built).
    pub(super) fn charge_output(&mut self) {
        let now = chargeable(self.input.len(), self.out.capacity());
        if now > self.charged_bytes {
            self.shared.buffer_budget.take(now - self.charged_bytes);
            self.charged_bytes = now;
        }
    }

    /// Replaces both buffers by small ones and gives the difference back. Only with nothing
    /// buffered and nothing to send.
    fn shrink_buffers(&mut self) {
        assert!(self.start == self.end && self.out.is_empty(), "shrinking buffers that hold bytes");
        if self.input.len() > SMALL_INPUT_BYTES {
            self.input = vec![0; SMALL_INPUT_BYTES];
        }
        if self.out.capacity() > SMALL_OUTPUT_BYTES {
            self.out = Vec::with_capacity(SMALL_OUTPUT_BYTES);
        }
        (self.start, self.end) = (0, 0);
        let now = chargeable(self.input.len(), self.out.capacity());
        self.shared.buffer_budget.give_back(self.charged_bytes - now);
        self.charged_bytes = now;
    }

    /// Gives every charged byte back; the connection is ending.
    pub(super) fn release_buffers(&mut self) {
        self.shared.buffer_budget.give_back(self.charged_bytes);
        self.charged_bytes = 0;
    }

    /// After a frame is served: the next frame's clock starts with the next bytes read.
    pub(super) fn frame_done(&mut self) {
        self.frame_started = None;
    }

    /// The wait for more input while serving requests: reads once, with the deadlines of this
    /// module applied. Called only when no complete frame is buffered and the output is sent.
    pub(super) fn fill_serving(&mut self) -> Result<(), ConnectionEnd> {
        loop {
            let empty = self.nothing_buffered();
            if empty {
                self.frame_started = None;
                if self.input.len() > INPUT_BUFFER_BYTES {
                    // The one large frame is done: back to the working size.
                    self.shrink_buffers();
                }
            } else if self.frame_started.get_or_insert_with(Instant::now).elapsed() >= PARTIAL_FRAME_TIMEOUT {
                if BUFFER_LIMIT_CLOSES.allow() {
                    tracing::warn!(peer = %self.peer, client_id = self.client_id, buffered_bytes = self.end - self.start,
                        "a frame was not completed within {} s: closing", PARTIAL_FRAME_TIMEOUT.as_secs());
                }
                return Err(ConnectionEnd::PartialFrameTimeout);
            }
            let small = self.charged_bytes == 0;
            // An idle claimed connection wakes once per lease timeout to see whether it lapsed.
            let lease_timeout =
                (self.claimed && self.session != 0).then(|| self.shared.core.leases.timeout());
            let timeout = if empty && small { lease_timeout } else { Some(IDLE_SHRINK_AFTER) };
            if timeout != self.read_timeout {
                self.stream.set_read_timeout(timeout).map_err(end_of_io)?;
                self.read_timeout = timeout;
            }
            let buffered = self.end - self.start;
            match self.fill() {
                Ok(()) => {
                    if self.frame_started.is_none() {
                        self.frame_started = Some(Instant::now());
                    }
                    // A read that filled the buffer had more waiting: a busy client.
                    if self.end == self.input.len() && self.input.len() < INPUT_BUFFER_BYTES {
                        self.try_grow_input(INPUT_BUFFER_BYTES);
                    }
                    return Ok(());
                }
                Err(ConnectionEnd::Io(error)) if is_timeout(&error) => {
                    // Idle with small buffers, this read waited the whole lease timeout: nothing
                    // came in that long (no clock read per read needed to know it).
                    if let (true, true, Some(lease_timeout)) = (empty, small, lease_timeout) {
                        return Err(ConnectionEnd::LeaseTimeout(lease_timeout));
                    }
                    if buffered == 0 {
                        self.shrink_buffers();
                    }
                }
                Err(end) => return Err(end),
            }
        }
    }
}

fn is_timeout(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

impl Connection {
    /// Half-closes, then briefly discards what the peer still sends: closing a socket with unread
    /// input makes the kernel send a reset, which can destroy the `Error` reply before the peer
    /// reads it. Bounded in time and bytes so a hostile peer cannot hold the thread.
    pub(super) fn linger(&mut self) {
        const LINGER: Duration = Duration::from_millis(200);
        const LINGER_MAX_BYTES: usize = 2 * 1024 * 1024;
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        if self.stream.set_read_timeout(Some(LINGER)).is_err() {
            return;
        }
        let started = Instant::now();
        let mut discarded = 0;
        let mut sink = [0u8; 4096];
        while discarded < LINGER_MAX_BYTES && started.elapsed() < LINGER {
            match io::Read::read(&mut &self.stream, &mut sink) {
                Ok(0) | Err(_) => return,
                Ok(n) => discarded += n,
            }
        }
    }
}
