//! Knobs of the simulated network and nodes, and units of simulated time.

use crate::SimTime;

/// One microsecond of simulated time.
pub const MICROSECOND: SimTime = 1_000;
/// One millisecond of simulated time.
pub const MILLISECOND: SimTime = 1_000 * MICROSECOND;
/// One second of simulated time.
pub const SECOND: SimTime = 1_000 * MILLISECOND;

/// How long things take in the simulation. `Default` is a LAN of these VMs: 20 us ± 10 us one
/// way, and a rebuild of about 2 us per page (a 64 MiB slab of 512-byte splits in 0.26 s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetworkOptions {
    /// Mean one-way delay of one message (a `send`, or one node's answer to it).
    pub latency_ns: SimTime,
    /// Each message's one-way delay is drawn uniformly from `latency_ns - jitter_ns ..=
    /// latency_ns + jitter_ns` (never below zero).
    pub jitter_ns: SimTime,
    /// Simulated time a rebuild (`Regenerate`) spends per page of the target slab.
    pub regeneration_ns_per_page: SimTime,
    /// Pages a rebuild reads and stores in one step, at most what one `ReadSplitsReply` carries
    /// (256 slots, 255 of 4 KiB), the real node's batch. Between steps the client's writes,
    /// unmaps and faults interleave with the rebuild.
    pub regeneration_batch_pages: u32,
}

impl Default for NetworkOptions {
    fn default() -> NetworkOptions {
        NetworkOptions {
            latency_ns: 20 * MICROSECOND,
            jitter_ns: 10 * MICROSECOND,
            regeneration_ns_per_page: 2 * MICROSECOND,
            regeneration_batch_pages: 256,
        }
    }
}
