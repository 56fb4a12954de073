//! Seeded fault plans for scenario runners: which node fails how, and when.
//!
//! Following VOPR's rule, a plan either stays within what the code claims to survive or knowingly
//! goes beyond it, and says which: [`FaultSchedule::within_tolerance`] hits at most r distinct
//! nodes over the whole run, so no range ever has more than r of its k + r slabs hit (whatever
//! the placement), and [`FaultSchedule::beyond_tolerance`] hits at least r + 1, so some runs
//! must see `Lost` or `WriteFailed` (never wrong data). Each faulty node gets one episode of one
//! kind: a crash (with or without a restart), a stall, a partition, a straggler delay, bit flips,
//! an eviction or dropped writes.

use crate::cluster::PartitionNotice;
use crate::{SimTime, MICROSECOND, MILLISECOND};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// One fault to apply to one node with [`crate::SimCluster::apply_fault`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    Kill,
    RestartEmpty,
    Stall {
        until: SimTime,
    },
    Partition {
        until: SimTime,
        notice: PartitionNotice,
    },
    ExtraDelay {
        delay_ns: SimTime,
        jitter_ns: SimTime,
    },
    /// Bit flips in one of the node's slabs, chosen when applied.
    FlipBits {
        flips: u32,
    },
    /// Evicts one of the node's slabs, chosen when applied.
    Evict,
    DropNextWrites {
        count: u32,
    },
}

/// A fault at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledFault {
    pub at: SimTime,
    pub node: usize,
    pub action: FaultAction,
}

/// The shape of a generated plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultScheduleOptions {
    pub node_count: usize,
    /// How many distinct nodes get a fault: drawn uniformly from `min..=max` (capped at
    /// `node_count`).
    pub min_faulty_nodes: usize,
    pub max_faulty_nodes: usize,
    /// Faults start in `0..duration_ns`.
    pub duration_ns: SimTime,
    /// Crashes (before a restart), stalls and partitions last 1 ms..=this.
    pub max_outage_ns: SimTime,
    /// A straggler's extra delay is 100 us..=this, its jitter up to half of it.
    pub max_straggler_delay_ns: SimTime,
    /// Bit flips per fault: 1..=this.
    pub max_flips: u32,
    /// Dropped writes per fault: 1..=this.
    pub max_dropped_writes: u32,
}

impl FaultScheduleOptions {
    /// Outages up to a quarter of the run, stragglers up to 5 ms, up to 8 flips or dropped
    /// writes, and `min..=max` faulty nodes.
    pub fn new(
        node_count: usize,
        min_faulty_nodes: usize,
        max_faulty_nodes: usize,
        duration_ns: SimTime,
    ) -> Self {
        FaultScheduleOptions {
            node_count,
            min_faulty_nodes,
            max_faulty_nodes,
            duration_ns,
            max_outage_ns: (duration_ns / 4).max(MILLISECOND),
            max_straggler_delay_ns: 5 * MILLISECOND,
            max_flips: 8,
            max_dropped_writes: 8,
        }
    }
}

/// A fault plan, sorted by time (ties by node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultSchedule {
    pub faults: Vec<ScheduledFault>,
    /// The distinct nodes the plan hits, sorted.
    pub faulty_nodes: Vec<usize>,
}

impl FaultSchedule {
    /// Faults on 1..=r distinct nodes (none if r = 0): a run the code must survive.
    pub fn within_tolerance(seed: u64, node_count: usize, r: usize, duration_ns: SimTime) -> FaultSchedule {
        let options = FaultScheduleOptions::new(node_count, r.min(1), r, duration_ns);
        FaultSchedule::generate(seed, &options)
    }

    /// Faults on r + 1..=2r + 1 distinct nodes (at most all of them): a run where some pages may
    /// be lost, which must then be reported, never returned wrong.
    pub fn beyond_tolerance(seed: u64, node_count: usize, r: usize, duration_ns: SimTime) -> FaultSchedule {
        let options = FaultScheduleOptions::new(node_count, r + 1, 2 * r + 1, duration_ns);
        FaultSchedule::generate(seed, &options)
    }

    /// Draws a plan: the number of faulty nodes, which nodes, and for each one episode of a
    /// random kind at a random time. The same seed and options give the same plan.
    pub fn generate(seed: u64, options: &FaultScheduleOptions) -> FaultSchedule {
        let mut rng = StdRng::seed_from_u64(seed);
        let max = options.max_faulty_nodes.min(options.node_count);
        let min = options.min_faulty_nodes.min(max);
        let count = rng.gen_range(min..=max);
        let mut nodes: Vec<usize> = (0..options.node_count).collect();
        nodes.shuffle(&mut rng);
        nodes.truncate(count);
        nodes.sort_unstable();
        let mut faults = Vec::new();
        for &node in &nodes {
            let at = rng.gen_range(0..options.duration_ns.max(1));
            let outage = rng.gen_range(MILLISECOND.min(options.max_outage_ns)..=options.max_outage_ns);
            let mut push =
                |at: SimTime, action: FaultAction| faults.push(ScheduledFault { at, node, action });
            match rng.gen_range(0..8) {
                0 => push(at, FaultAction::Kill),
                1 => {
                    push(at, FaultAction::Kill);
                    push(at + outage, FaultAction::RestartEmpty);
                }
                2 => push(at, FaultAction::Stall { until: at + outage }),
                3 => {
                    let notice = match rng.gen_range(0..3) {
                        0 => PartitionNotice::Immediately,
                        1 => PartitionNotice::After(rng.gen_range(0..=outage)),
                        _ => PartitionNotice::Never,
                    };
                    push(at, FaultAction::Partition { until: at + outage, notice });
                }
                4 => {
                    let max_delay = options.max_straggler_delay_ns.max(100 * MICROSECOND);
                    let delay_ns = rng.gen_range(100 * MICROSECOND..=max_delay);
                    let jitter_ns = rng.gen_range(0..=delay_ns / 2);
                    push(at, FaultAction::ExtraDelay { delay_ns, jitter_ns });
                }
                5 => push(at, FaultAction::FlipBits { flips: rng.gen_range(1..=options.max_flips.max(1)) }),
                6 => push(at, FaultAction::Evict),
                _ => push(
                    at,
                    FaultAction::DropNextWrites {
                        count: rng.gen_range(1..=options.max_dropped_writes.max(1)),
                    },
                ),
            }
        }
        faults.sort_by_key(|fault| (fault.at, fault.node));
        FaultSchedule { faults, faulty_nodes: nodes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SECOND;

    #[test]
    fn within_tolerance_hits_at_most_r_distinct_nodes_and_beyond_at_least_r_plus_one() {
        for seed in 0..200 {
            let within = FaultSchedule::within_tolerance(seed, 12, 2, SECOND);
            assert!((1..=2).contains(&within.faulty_nodes.len()));
            let beyond = FaultSchedule::beyond_tolerance(seed, 12, 2, SECOND);
            assert!((3..=5).contains(&beyond.faulty_nodes.len()));
            for schedule in [&within, &beyond] {
                assert!(schedule.faults.iter().all(|fault| schedule.faulty_nodes.contains(&fault.node)));
                assert!(schedule.faults.windows(2).all(|pair| pair[0].at <= pair[1].at));
            }
        }
        assert!(FaultSchedule::within_tolerance(3, 12, 0, SECOND).faults.is_empty());
        assert_eq!(FaultSchedule::beyond_tolerance(3, 2, 4, SECOND).faulty_nodes, vec![0, 1]);
    }

    #[test]
    fn a_seed_gives_the_same_plan() {
        let options = FaultScheduleOptions::new(9, 1, 3, SECOND);
        assert_eq!(FaultSchedule::generate(11, &options), FaultSchedule::generate(11, &options));
        let plans: Vec<_> = (0..20).map(|seed| FaultSchedule::generate(seed, &options)).collect();
        assert!(plans.windows(2).any(|pair| pair[0] != pair[1]), "seeds differ");
    }
}
