//! Counts of the faults a run injected, per kind, for the sweeps' summaries.

/// Faults applied by the driver, per kind (those the cluster refused are counted apart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultTally {
    pub kills: u64,
    pub restarts_empty: u64,
    /// Stalls shorter than the engine's request timeout, and at least as long.
    pub short_stalls: u64,
    pub long_stalls: u64,
    pub partitions: u64,
    pub stragglers: u64,
    pub bit_flips: u64,
    pub evictions: u64,
    pub dropped_writes: u64,
    pub client_crashes: u64,
    /// Scheduled faults the cluster refused (a kill of a dead node, flips on a node with no
    /// slab): nothing happened.
    pub refused: u64,
}

impl FaultTally {
    pub fn add(&mut self, other: &FaultTally) {
        self.kills += other.kills;
        self.restarts_empty += other.restarts_empty;
        self.short_stalls += other.short_stalls;
        self.long_stalls += other.long_stalls;
        self.partitions += other.partitions;
        self.stragglers += other.stragglers;
        self.bit_flips += other.bit_flips;
        self.evictions += other.evictions;
        self.dropped_writes += other.dropped_writes;
        self.client_crashes += other.client_crashes;
        self.refused += other.refused;
    }

    /// Faults that took effect.
    pub fn total(&self) -> u64 {
        self.kills
            + self.restarts_empty
            + self.short_stalls
            + self.long_stalls
            + self.partitions
            + self.stragglers
            + self.bit_flips
            + self.evictions
            + self.dropped_writes
            + self.client_crashes
    }
}

impl std::fmt::Display for FaultTally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kill {}, restart-empty {}, stall<timeout {}, stall>=timeout {}, partition {}, straggler {}, \
             bit-flips {}, eviction {}, dropped-writes {}, client-crash {} (refused {})",
            self.kills,
            self.restarts_empty,
            self.short_stalls,
            self.long_stalls,
            self.partitions,
            self.stragglers,
            self.bit_flips,
            self.evictions,
            self.dropped_writes,
            self.client_crashes,
            self.refused
        )
    }
}
