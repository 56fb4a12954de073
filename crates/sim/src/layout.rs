//! A layout: the nodes of every range after placing them with a policy, and what a set of
//! failed nodes does to it.
//!
//! The Monte Carlo check of one failure set walks only the ranges of the failed nodes (an
//! inverted index, node -> ranges) and counts failed members per range in a preallocated
//! counter array: F*S steps per trial instead of the R*(k+r) of checking every range, and no
//! allocation. `lost_ranges_by_bitset` checks every range against a bitset of failed nodes; it
//! is the slow reference the tests compare with.

use rand::Rng;
use remem_placement::{NodeLoad, Placement, PlacementError};

/// Ranges placed on `node_count` nodes, `width` nodes each.
pub struct Layout {
    node_count: usize,
    width: usize,
    /// Range-major: the nodes of range i are `range_nodes[i*width..(i+1)*width]`.
    range_nodes: Vec<u32>,
    /// Inverted index: the ranges of node n are `node_ranges[node_offsets[n]..node_offsets[n+1]]`.
    node_offsets: Vec<u32>,
    node_ranges: Vec<u32>,
}

/// Spread of slabs per node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadBalance {
    pub max_over_mean: f64,
    pub coefficient_of_variation: f64,
}

/// Per-thread scratch space for loss checks.
pub struct LossScratch {
    failed_per_range: Vec<u8>,
    nodes: Vec<u32>,
}

impl Layout {
    /// Places `range_count` ranges of `width` nodes with `policy`, exactly as a client maps
    /// ranges: one `place` call per range on the current loads, then the chosen nodes' loads
    /// grow by one slab. Every node is its own failure domain and has room for any number of
    /// slabs, so the layout shows the policy's own balance, not a capacity limit's.
    pub fn place(
        policy: &mut dyn Placement,
        node_count: usize,
        width: usize,
        range_count: usize,
    ) -> Result<Layout, PlacementError> {
        let mut loads: Vec<NodeLoad> = (0..node_count)
            .map(|node_index| NodeLoad {
                node_index,
                failure_domain: String::new(),
                slabs_mapped: 0,
                slabs_free: u64::MAX,
            })
            .collect();
        let mut range_nodes = Vec::with_capacity(range_count * width);
        for _ in 0..range_count {
            let placed = policy.place(&loads, width)?;
            assert_eq!(placed.nodes.len(), width, "a policy returns width nodes");
            for &node in &placed.nodes {
                loads[node].slabs_mapped += 1;
                range_nodes.push(u32::try_from(node).expect("node count fits u32"));
            }
        }
        Ok(Layout::from_range_nodes(node_count, width, range_nodes))
    }

    /// A layout from explicit ranges (range-major, `width` nodes each, distinct within a range).
    pub fn from_range_nodes(node_count: usize, width: usize, range_nodes: Vec<u32>) -> Layout {
        assert!(width > 0 && range_nodes.chunks_exact(width).remainder().is_empty(), "whole ranges only");
        for range in range_nodes.chunks(width) {
            for (i, &node) in range.iter().enumerate() {
                assert!((node as usize) < node_count, "node {node} out of {node_count}");
                assert!(!range[..i].contains(&node), "node {node} twice in one range");
            }
        }
        let mut node_offsets = vec![0u32; node_count + 1];
        for &node in &range_nodes {
            node_offsets[node as usize + 1] += 1;
        }
        for n in 0..node_count {
            node_offsets[n + 1] += node_offsets[n];
        }
        let mut next: Vec<u32> = node_offsets[..node_count].to_vec();
        let mut node_ranges = vec![0u32; range_nodes.len()];
        for (slot, &node) in range_nodes.iter().enumerate() {
            node_ranges[next[node as usize] as usize] = (slot / width) as u32;
            next[node as usize] += 1;
        }
        Layout { node_count, width, range_nodes, node_offsets, node_ranges }
    }

    pub fn node_count(&self) -> usize {
        self.node_count
    }

    pub fn range_count(&self) -> usize {
        self.range_nodes.len() / self.width
    }

    pub fn range(&self, range: usize) -> &[u32] {
        &self.range_nodes[range * self.width..(range + 1) * self.width]
    }

    /// Slabs on each node.
    pub fn slabs_per_node(&self) -> Vec<u32> {
        self.node_offsets.windows(2).map(|w| w[1] - w[0]).collect()
    }

    pub fn load_balance(&self) -> LoadBalance {
        let slabs = self.slabs_per_node();
        let mean = slabs.iter().map(|&s| f64::from(s)).sum::<f64>() / slabs.len() as f64;
        let max = slabs.iter().copied().max().unwrap_or(0);
        let variance = slabs.iter().map(|&s| (f64::from(s) - mean).powi(2)).sum::<f64>() / slabs.len() as f64;
        LoadBalance { max_over_mean: f64::from(max) / mean, coefficient_of_variation: variance.sqrt() / mean }
    }

    /// Distinct (r+1)-subsets of nodes contained in some range: the layout's copysets. `None`
    /// when enumerating them would take more than `limit` subsets.
    pub fn copyset_count(&self, parity_splits: usize, limit: f64) -> Option<u64> {
        let size = parity_splits + 1;
        if size > self.width {
            return Some(0);
        }
        let per_range = crate::closed_form::binomial(self.width as u64, size as u64);
        if per_range * self.range_count() as f64 > limit {
            return None;
        }
        let mut seen: std::collections::HashSet<Vec<u32>> = std::collections::HashSet::new();
        let mut sorted = vec![0u32; self.width];
        let mut chosen = vec![0usize; size];
        for range in 0..self.range_count() {
            sorted.copy_from_slice(self.range(range));
            sorted.sort_unstable();
            // Lexicographic enumeration of index combinations.
            for (i, c) in chosen.iter_mut().enumerate() {
                *c = i;
            }
            loop {
                seen.insert(chosen.iter().map(|&i| sorted[i]).collect());
                let Some(i) = (0..size).rev().find(|&i| chosen[i] < self.width - size + i) else { break };
                chosen[i] += 1;
                for j in i + 1..size {
                    chosen[j] = chosen[j - 1] + 1;
                }
            }
        }
        Some(seen.len() as u64)
    }

    pub fn scratch(&self) -> LossScratch {
        LossScratch {
            failed_per_range: vec![0; self.range_count()],
            nodes: (0..self.node_count as u32).collect(),
        }
    }

    /// Ranges with more than `parity_splits` of their nodes in `failed` (distinct nodes).
    pub fn lost_ranges(&self, failed: &[u32], parity_splits: usize, scratch: &mut LossScratch) -> usize {
        let mut lost = 0;
        for &node in failed {
            for &range in self.ranges_of(node) {
                let count = &mut scratch.failed_per_range[range as usize];
                *count += 1;
                lost += usize::from(usize::from(*count) == parity_splits + 1);
            }
        }
        for &node in failed {
            for &range in self.ranges_of(node) {
                scratch.failed_per_range[range as usize] = 0;
            }
        }
        lost
    }

    /// The reference check: every range against a bitset of failed nodes.
    pub fn lost_ranges_by_bitset(&self, failed_bitset: &[u64], parity_splits: usize) -> usize {
        assert!(failed_bitset.len() * 64 >= self.node_count, "one bit per node");
        self.range_nodes
            .chunks(self.width)
            .filter(|range| {
                let failed =
                    range.iter().filter(|&&n| failed_bitset[n as usize / 64] >> (n % 64) & 1 == 1).count();
                failed > parity_splits
            })
            .count()
    }

    fn ranges_of(&self, node: u32) -> &[u32] {
        let (start, end) = (self.node_offsets[node as usize], self.node_offsets[node as usize + 1]);
        &self.node_ranges[start as usize..end as usize]
    }

    /// Runs `trials` failures of `failed_count` uniformly random distinct nodes and returns how
    /// many lost at least one range.
    pub fn monte_carlo<R: Rng>(
        &self,
        failed_count: usize,
        parity_splits: usize,
        trials: u64,
        rng: &mut R,
        scratch: &mut LossScratch,
    ) -> u64 {
        assert!(failed_count <= self.node_count, "cannot fail more nodes than exist");
        assert!(parity_splits < 255, "per-range counters are u8");
        let mut losing = 0;
        for _ in 0..trials {
            // A partial Fisher-Yates shuffle: the first failed_count entries are a uniform
            // random subset (the permutation left by earlier trials does not bias it).
            for i in 0..failed_count {
                let j = rng.gen_range(i..self.node_count);
                scratch.nodes.swap(i, j);
            }
            let failed = std::mem::take(&mut scratch.nodes);
            losing += u64::from(self.lost_ranges(&failed[..failed_count], parity_splits, scratch) > 0);
            scratch.nodes = failed;
        }
        losing
    }

    /// The exact probability that `failed_count` uniformly random nodes lose a range, by
    /// enumerating every failure set. For tiny clusters only (asserts at most 10 million sets).
    pub fn exact_loss_probability(&self, failed_count: usize, parity_splits: usize) -> f64 {
        let sets = crate::closed_form::binomial(self.node_count as u64, failed_count as u64);
        assert!(sets <= 1e7, "{sets} failure sets is too many to enumerate");
        let mut scratch = self.scratch();
        let mut chosen: Vec<u32> = (0..failed_count as u32).collect();
        let mut losing = 0u64;
        let mut total = 0u64;
        let n = self.node_count as u32;
        let k = failed_count as u32;
        loop {
            total += 1;
            losing += u64::from(self.lost_ranges(&chosen, parity_splits, &mut scratch) > 0);
            let Some(i) = (0..failed_count).rev().find(|&i| chosen[i] < n - k + i as u32) else { break };
            chosen[i] += 1;
            for j in i + 1..failed_count {
                chosen[j] = chosen[j - 1] + 1;
            }
        }
        losing as f64 / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use remem_placement::{CodingSets, GroupChoice, Random};

    fn bitset(failed: &[u32], node_count: usize) -> Vec<u64> {
        let mut bits = vec![0u64; node_count.div_ceil(64)];
        for &n in failed {
            bits[n as usize / 64] |= 1 << (n % 64);
        }
        bits
    }

    #[test]
    fn inverted_index_lists_every_slab() {
        let layout = Layout::from_range_nodes(4, 2, vec![0, 1, 1, 2, 3, 1]);
        assert_eq!(layout.slabs_per_node(), vec![1, 3, 1, 1]);
        assert_eq!(layout.ranges_of(1), &[0, 1, 2]);
        let balance = layout.load_balance();
        assert!((balance.max_over_mean - 2.0).abs() < 1e-12);
    }

    #[test]
    fn copysets_of_disjoint_groups_by_hand() {
        // Two disjoint ranges of 3 nodes, r=1: 3 pairs each.
        let layout = Layout::from_range_nodes(6, 3, vec![0, 1, 2, 3, 4, 5, 0, 2, 1]);
        assert_eq!(layout.copyset_count(1, 1e6), Some(6));
        assert_eq!(layout.copyset_count(2, 1e6), Some(2));
    }

    #[test]
    fn exact_loss_of_two_groups_by_hand() {
        // Nodes 0..6 in two ranges {0,1,2},{3,4,5}; r=1; 2 failures lose iff both in one
        // range: 2*C(3,2)/C(6,2) = 6/15.
        let layout = Layout::from_range_nodes(6, 3, vec![0, 1, 2, 3, 4, 5]);
        assert!((layout.exact_loss_probability(2, 1) - 0.4).abs() < 1e-12);
        assert_eq!(layout.exact_loss_probability(1, 1), 0.0);
    }

    #[test]
    fn monte_carlo_agrees_with_enumeration_n12_k2_r1() {
        for (name, mut policy) in [
            ("random", Box::new(Random::new(StdRng::seed_from_u64(5))) as Box<dyn Placement>),
            ("codingsets", Box::new(CodingSets::new(StdRng::seed_from_u64(6), 1, GroupChoice::Random))),
        ] {
            let layout = Layout::place(policy.as_mut(), 12, 3, 16).unwrap();
            for failed_count in [2, 3, 4] {
                let exact = layout.exact_loss_probability(failed_count, 1);
                let trials = 40_000;
                let mut scratch = layout.scratch();
                let mut rng = StdRng::seed_from_u64(failed_count as u64);
                let losing = layout.monte_carlo(failed_count, 1, trials, &mut rng, &mut scratch);
                let estimate = losing as f64 / trials as f64;
                let standard_error = (exact * (1.0 - exact) / trials as f64).sqrt();
                assert!(
                    (estimate - exact).abs() <= 4.0 * standard_error + 1e-9,
                    "{name} F={failed_count}: monte carlo {estimate} vs exact {exact} (se {standard_error})"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn inverted_index_matches_bitset_reference(
            seed in any::<u64>(),
            node_count in 4usize..80,
            failed_fraction in 0.0f64..1.0,
            parity_splits in 0usize..3,
        ) {
            let width = 3.min(node_count);
            let mut policy = Random::new(StdRng::seed_from_u64(seed));
            let layout = Layout::place(&mut policy, node_count, width, node_count * 2).unwrap();
            let failed_count = (node_count as f64 * failed_fraction) as usize;
            let mut rng = StdRng::seed_from_u64(seed ^ 1);
            let mut nodes: Vec<u32> = (0..node_count as u32).collect();
            for i in 0..failed_count {
                let j = rand::Rng::gen_range(&mut rng, i..node_count);
                nodes.swap(i, j);
            }
            let failed = &nodes[..failed_count];
            let mut scratch = layout.scratch();
            prop_assert_eq!(
                layout.lost_ranges(failed, parity_splits, &mut scratch),
                layout.lost_ranges_by_bitset(&bitset(failed, node_count), parity_splits)
            );
            // The scratch counters are back to zero.
            prop_assert!(scratch.failed_per_range.iter().all(|&c| c == 0));
        }
    }
}
