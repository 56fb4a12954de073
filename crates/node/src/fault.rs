//! Fault injection (`InjectFault`, accepted only when the node runs with `fault_injection`):
//! reply delays, bit flips in slab memory, and the RNG both use.
//!
//! Faults are seeded so that a run reproduces: a delay's rolls come from `seed ^ connection
//! number`, a corruption's flips from its own seed. The delay is a standing fault read by every
//! connection before it writes its output; the hot path pays one atomic load per write when no
//! fault was ever injected.

use crate::core::Slab;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// SplitMix64: tiny, seedable and stable across crate versions, which is what reproducible
/// fault runs need (statistical quality beyond that does not matter here).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..bound` (`bound > 0`); the modulo bias is irrelevant for fault rolls.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0);
        self.next_u64() % bound
    }
}

/// The standing delay fault.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DelayFault {
    pub delay_us: u32,
    pub fraction_ppm: u32,
    pub seed: u64,
}

/// Node-wide fault state.
pub struct Faults {
    /// Whether `InjectFault` is accepted at all (`NodeConfig::fault_injection`).
    pub enabled: bool,
    /// Bumped on every change of `delay`; 0 means no delay was ever set.
    generation: AtomicU64,
    delay: Mutex<DelayFault>,
}

impl Faults {
    pub fn new(enabled: bool) -> Faults {
        Faults { enabled, generation: AtomicU64::new(0), delay: Mutex::new(DelayFault::default()) }
    }

    /// Replaces the standing delay (`DelayFault::default()` clears it).
    pub fn set_delay(&self, delay: DelayFault) {
        *self.delay.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = delay;
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// One connection's view of the delay fault: its own seeded RNG, refreshed when the fault changes.
pub struct ConnectionDelay {
    connection: u64,
    generation: u64,
    delay: DelayFault,
    rng: SplitMix64,
}

impl ConnectionDelay {
    pub fn new(connection: u64) -> ConnectionDelay {
        ConnectionDelay { connection, generation: 0, delay: DelayFault::default(), rng: SplitMix64::new(0) }
    }

    /// How long to hold back a write carrying `replies` replies: `delay_us` if any of them rolls
    /// under `fraction_ppm`, else nothing.
    pub fn roll(&mut self, faults: &Faults, replies: u32) -> Option<Duration> {
        let generation = faults.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.generation = generation;
            self.delay = *faults.delay.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            self.rng = SplitMix64::new(self.delay.seed ^ self.connection);
        }
        if self.delay.delay_us == 0 || self.delay.fraction_ppm == 0 {
            return None;
        }
        let mut delayed = false;
        for _ in 0..replies {
            delayed |= self.rng.below(1_000_000) < u64::from(self.delay.fraction_ppm);
        }
        delayed.then(|| Duration::from_micros(u64::from(self.delay.delay_us)))
    }
}

/// Flips `flips` random bits (seeded) in the bytes of written slots (version != 0) of `slab`;
/// metadata is untouched. Returns the slots hit, in order, repeats included (empty if no slot is
/// written).
pub fn corrupt(slab: &Slab, flips: u32, seed: u64) -> Vec<u32> {
    let written: Vec<u32> = (0..slab.slots()).filter(|slot| slab.meta(*slot).version != 0).collect();
    if written.is_empty() {
        return Vec::new();
    }
    let mut rng = SplitMix64::new(seed);
    let bits = u64::from(slab.split_bytes()) * 8;
    (0..flips)
        .map(|_| {
            let slot = written[rng.below(written.len() as u64) as usize];
            slab.flip_bit(slot, rng.below(bits) as usize);
            slot
        })
        .collect()
}
