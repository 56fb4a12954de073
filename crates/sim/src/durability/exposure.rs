//! How exposed a range is to loss right now: the rate at which one more failure would lose it,
//! and the expected rate of losing it after one more failure that does not.
//!
//! A failure *source* is a node (it takes its slab of the range) or a rack (it takes every
//! slab of the range it holds at once). A range with `down` slabs out of k+r is lost by a
//! source whose jump `j` (slabs it takes) makes `down + j > r`. For sources that fail at
//! constant rates (exponential lifetimes), the sum of those rates, integrated over time, is
//! the compensator of the range's loss count: its expectation equals the expected number of
//! losses, with far less variance than counting them (first order, exact in expectation).
//!
//! The second order looks one failure ahead: for each source that would not lose the range,
//! its rate times the first-order rate of the state it would leave, times how long that state
//! would last (until the range's first down slab comes back). It estimates losses that need two
//! more failures, which is how a domain-aware EC(k,r) range with r >= 2 is lost; the time the
//! state would last is an estimate (see docs/PLACEMENT.md).

/// The failure rates of the sources, per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Every node event that takes its slabs down (permanent and transient failures).
    pub node_per_second: f64,
    pub rack_per_second: f64,
}

/// Slabs of the range in each distinct rack among `racks`, as (rack, count) pairs.
fn rack_counts(racks: &[u32], out: &mut Vec<(u32, usize)>) {
    out.clear();
    for &rack in racks {
        match out.iter_mut().find(|(r, _)| *r == rack) {
            Some((_, count)) => *count += 1,
            None => out.push((rack, 1)),
        }
    }
}

/// First order: the rate (per second) at which a single failure loses a range with `down`
/// slabs down whose live slabs are in `live_racks` (one entry per live slab: its rack).
pub fn kill_rate(down: usize, live_racks: &[u32], parity_splits: usize, rates: Rates) -> f64 {
    let mut counts = Vec::with_capacity(live_racks.len());
    kill_rate_with(down, live_racks, parity_splits, rates, &mut counts)
}

fn kill_rate_with(
    down: usize,
    racks: &[u32],
    parity_splits: usize,
    rates: Rates,
    counts: &mut Vec<(u32, usize)>,
) -> f64 {
    let mut rate = 0.0;
    if down + 1 > parity_splits {
        rate += racks.len() as f64 * rates.node_per_second;
    }
    rack_counts(racks, counts);
    for &(_, count) in counts.iter() {
        if down + count > parity_splits {
            rate += rates.rack_per_second;
        }
    }
    rate
}

/// Second order: the sum over sources that would not lose the range of (their rate) x (the
/// first-order rate of the state they would leave), per second squared. Multiplied by how long
/// that state lasts it is an expected loss rate.
pub fn second_order_rate(down: usize, live_racks: &[u32], parity_splits: usize, rates: Rates) -> f64 {
    let racks = live_racks;
    let mut counts = Vec::with_capacity(racks.len());
    let mut scratch = Vec::with_capacity(racks.len());
    let mut rest: Vec<u32> = Vec::with_capacity(racks.len());
    let mut total = 0.0;
    // One live node fails.
    if down < parity_splits {
        for skip in 0..racks.len() {
            rest.clear();
            rest.extend(racks.iter().enumerate().filter(|&(i, _)| i != skip).map(|(_, &r)| r));
            total +=
                rates.node_per_second * kill_rate_with(down + 1, &rest, parity_splits, rates, &mut scratch);
        }
    }
    // One rack fails, taking all of its live slabs.
    rack_counts(racks, &mut counts);
    for &(rack, count) in &counts {
        if down + count <= parity_splits {
            rest.clear();
            rest.extend(racks.iter().copied().filter(|&r| r != rack));
            total += rates.rack_per_second
                * kill_rate_with(down + count, &rest, parity_splits, rates, &mut scratch);
        }
    }
    total
}

/// The integral over [from, to] of (until - t) where positive: how much "state time" a
/// second-order rate is exposed over, when the state would end at `until`.
pub fn remaining_time_integral(from: f64, to: f64, until: f64) -> f64 {
    let square = |t: f64| {
        let left = (until - t).max(0.0);
        left * left / 2.0
    };
    square(from) - square(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATES: Rates = Rates { node_per_second: 2.0, rack_per_second: 5.0 };

    #[test]
    fn distinct_racks_ec_r2_is_killed_only_at_two_down() {
        let racks = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(kill_rate(0, &racks, 2, RATES), 0.0);
        assert_eq!(kill_rate(1, &racks[..9], 2, RATES), 0.0);
        // Two down: any of the 8 live nodes or their 8 racks.
        assert_eq!(kill_rate(2, &racks[..8], 2, RATES), 8.0 * 2.0 + 8.0 * 5.0);
    }

    #[test]
    fn a_rack_with_r_plus_one_slabs_kills_a_healthy_range() {
        // Racks 0,0,0,1: r=2, nothing down; rack 0 holds three slabs.
        let racks = [0, 0, 0, 1];
        assert_eq!(kill_rate(0, &racks, 2, RATES), 5.0);
        assert_eq!(kill_rate(0, &racks, 3, RATES), 0.0);
    }

    #[test]
    fn second_order_of_one_down_ec_r2_counts_each_pair() {
        // 9 live slabs in 9 racks, one down, r=2: a node (rate 2) or rack (rate 5) fails, then any
        // of the 8 others' nodes or racks: 9 x (2 + 5) x 8 x (2 + 5).
        let racks = [0, 1, 2, 3, 4, 5, 6, 7, 8];
        let expected = 9.0 * 7.0 * 8.0 * 7.0;
        assert!((second_order_rate(1, &racks, 2, RATES) - expected).abs() < 1e-9);
        // With two down the next failure already kills: no second order.
        assert_eq!(second_order_rate(2, &racks[..8], 2, RATES), 0.0);
    }

    #[test]
    fn remaining_time_integral_stops_at_the_end_of_the_state() {
        assert_eq!(remaining_time_integral(0.0, 4.0, 4.0), 8.0);
        assert_eq!(remaining_time_integral(0.0, 10.0, 4.0), 8.0);
        assert_eq!(remaining_time_integral(5.0, 10.0, 4.0), 0.0);
        assert_eq!(remaining_time_integral(2.0, 3.0, 4.0), 2.0 - 0.5);
    }
}
