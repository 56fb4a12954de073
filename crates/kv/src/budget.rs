//! The output budget: bytes the server holds for replies, counted per connection and in total,
//! and the rule that decides whether a connection may start more work (docs/KV.md "Bounds").
//!
//! Held bytes are, for each connection: values reserved for its gets in flight (a fetch's
//! buffer and the reply it becomes, reserved when the key is looked up), finished replies
//! waiting for their turn, and rendered output not yet written to its socket. A reply that
//! arrives carries the reservation it replaces ([`crate::reply::Out::reserved`]), so the count is
//! exact: bytes are added when they are held and taken off when they are written or dropped.
//!
//! Invariants: the total is the sum of the open connections' counts plus the reservations of
//! connections that closed while their fetches were in flight (those come off the total when
//! the fetches finish and their replies are dropped). A connection may start a value while it
//! holds less than its limit and the server less than its total, or while it holds nothing at
//! all: the last rule lets every client that reads its answers make progress whatever other
//! connections hold, at the price of one value per such connection beyond the total.
//!
//! No I/O: the server tells it what it holds and writes, the cache what it reserves.

use crate::completion::ConnRef;

/// Default total of held bytes (`remem kv --output-budget`).
pub const DEFAULT_OUTPUT_BUDGET_BYTES: usize = 256 << 20;
/// The most one connection holds, when the budget is large enough (a quarter of it otherwise).
pub const MAX_CONNECTION_OUTPUT_BYTES: usize = 64 << 20;

#[derive(Clone, Copy, Debug, Default)]
struct Held {
    /// The connection in this slot now; 0 once it closed.
    generation: u64,
    bytes: usize,
}

#[derive(Debug)]
pub struct OutputBudget {
    total_limit_bytes: usize,
    connection_limit_bytes: usize,
    held_bytes: usize,
    peak_held_bytes: usize,
    /// By connection index.
    connections: Vec<Held>,
    /// Times a connection's next value (a get's key, a request) waited for the budget.
    pub waits: u64,
}

impl OutputBudget {
    /// A budget of `total_limit_bytes`; each connection may hold a quarter of it, at most
    /// [`MAX_CONNECTION_OUTPUT_BYTES`].
    pub fn new(total_limit_bytes: usize) -> OutputBudget {
        assert!(total_limit_bytes > 0);
        OutputBudget {
            total_limit_bytes,
            connection_limit_bytes: (total_limit_bytes / 4).clamp(1, MAX_CONNECTION_OUTPUT_BYTES),
            held_bytes: 0,
            peak_held_bytes: 0,
            connections: Vec::new(),
            waits: 0,
        }
    }

    pub fn total_limit_bytes(&self) -> usize {
        self.total_limit_bytes
    }

    pub fn connection_limit_bytes(&self) -> usize {
        self.connection_limit_bytes
    }

    /// Bytes held for replies now, by every connection.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// The most bytes held at once since the start.
    pub fn peak_held_bytes(&self) -> usize {
        self.peak_held_bytes
    }

    /// Bytes `conn` holds (0 for a connection that closed).
    pub fn held_by(&self, conn: ConnRef) -> usize {
        match self.connections.get(conn.index) {
            Some(held) if held.generation == conn.generation => held.bytes,
            _ => 0,
        }
    }

    /// A new connection holds nothing yet.
    pub fn open(&mut self, conn: ConnRef) {
        assert!(conn.generation != 0, "generation 0 marks a closed slot");
        if self.connections.len() <= conn.index {
            self.connections.resize(conn.index + 1, Held::default());
        }
        let slot = &mut self.connections[conn.index];
        assert!(slot.generation == 0 && slot.bytes == 0, "a slot is reused only once closed and empty");
        *slot = Held { generation: conn.generation, bytes: 0 };
    }

    /// A connection closed: what it still holds in its own buffers was released by the server;
    /// what remains are reservations of fetches in flight, which stay in the total until their
    /// replies arrive and are dropped.
    pub fn close(&mut self, conn: ConnRef) {
        if let Some(slot) = self.connections.get_mut(conn.index) {
            if slot.generation == conn.generation {
                *slot = Held::default();
            }
        }
    }

    /// `bytes` more are held for `conn` (its reply, output or a reservation).
    pub fn hold(&mut self, conn: ConnRef, bytes: usize) {
        self.held_bytes += bytes;
        self.peak_held_bytes = self.peak_held_bytes.max(self.held_bytes);
        if let Some(slot) = self.connections.get_mut(conn.index) {
            if slot.generation == conn.generation {
                slot.bytes += bytes;
            }
        }
    }

    /// `bytes` held for `conn` were written or dropped.
    pub fn release(&mut self, conn: ConnRef, bytes: usize) {
        assert!(bytes <= self.held_bytes, "released {bytes} B of {} B held", self.held_bytes);
        self.held_bytes -= bytes;
        if let Some(slot) = self.connections.get_mut(conn.index) {
            if slot.generation == conn.generation {
                assert!(bytes <= slot.bytes, "a connection released {bytes} B of {} B", slot.bytes);
                slot.bytes -= bytes;
            }
        }
    }

    /// Whether `conn` may start another value (a get's key, a request): it is under its limit and
    /// the server under its total, or it holds nothing.
    pub fn admits(&self, conn: ConnRef) -> bool {
        let held = self.held_by(conn);
        held == 0 || (held < self.connection_limit_bytes && self.held_bytes < self.total_limit_bytes)
    }

    /// Checks the counts: the total covers every open connection's bytes (the rest are
    /// reservations of closed connections' fetches), a closed slot holds nothing, and the
    /// peak is at least the total.
    pub fn check_invariants(&self) {
        let open: usize = self.connections.iter().map(|slot| slot.bytes).sum();
        assert!(open <= self.held_bytes, "open connections hold {open} B of the {} B total", self.held_bytes);
        assert!(
            self.connections.iter().all(|slot| slot.generation != 0 || slot.bytes == 0),
            "a closed slot holds nothing"
        );
        assert!(self.peak_held_bytes >= self.held_bytes, "the peak is at least the total");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(index: usize, generation: u64) -> ConnRef {
        ConnRef { index, generation }
    }

    #[test]
    fn a_connection_over_its_quarter_waits_and_one_holding_nothing_never_does() {
        let mut budget = OutputBudget::new(100);
        let (hog, reader) = (conn(0, 1), conn(1, 2));
        budget.open(hog);
        budget.open(reader);
        assert_eq!(budget.connection_limit_bytes(), 25);
        budget.hold(hog, 24);
        assert!(budget.admits(hog));
        budget.hold(hog, 1);
        assert!(!budget.admits(hog), "at its limit");
        budget.hold(reader, 80);
        assert!(!budget.admits(reader), "the server is over its total");
        budget.release(reader, 80);
        assert!(budget.admits(reader), "it holds nothing");
        budget.hold(conn(1, 2), 0);
        assert_eq!((budget.held_bytes(), budget.peak_held_bytes()), (25, 105));
        budget.check_invariants();
    }

    #[test]
    fn reservations_of_a_closed_connection_stay_in_the_total_until_released() {
        let mut budget = OutputBudget::new(1 << 20);
        let old = conn(3, 7);
        budget.open(old);
        budget.hold(old, 1000);
        budget.release(old, 400);
        budget.close(old);
        assert_eq!(budget.held_by(old), 0);
        assert_eq!(budget.held_bytes(), 600, "its fetches in flight still hold their buffers");
        budget.check_invariants();
        let new = conn(3, 8);
        budget.open(new);
        budget.hold(new, 10);
        budget.release(old, 600);
        assert_eq!((budget.held_by(new), budget.held_bytes()), (10, 10));
        budget.check_invariants();
    }

    #[test]
    fn small_budgets_give_each_connection_a_quarter_and_large_ones_64_mib() {
        assert_eq!(OutputBudget::new(32 << 20).connection_limit_bytes(), 8 << 20);
        assert_eq!(OutputBudget::new(DEFAULT_OUTPUT_BUDGET_BYTES).connection_limit_bytes(), 64 << 20);
        assert_eq!(OutputBudget::new(4 << 30).connection_limit_bytes(), 64 << 20);
    }
}
