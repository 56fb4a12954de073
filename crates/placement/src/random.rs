//! The baselines of seed 000 §7.2: [`Random`] (EC-Cache: `width` random nodes) and
//! [`PowerOfTwo`] (per split, the less loaded of two random nodes).
//!
//! Both sample candidates by index and reject unusable ones, so a call costs O(width) on a
//! large cluster instead of a pass over every node; the simulator relies on that to reach a
//! million nodes. When rejection keeps failing (few usable nodes, few domains left) a call
//! falls back to an exact pass over all candidates with the same rules, so the invariants of
//! the crate (distinct nodes, distinct domains while domains last) always hold.

use std::collections::HashMap;

use rand::seq::SliceRandom;
use rand::Rng;

use crate::{domain_key, take_spread, DomainKey, NodeLoad, Placed, Placement, PlacementError};

/// Rejection attempts per chosen node before the exact fallback.
const ATTEMPTS_PER_NODE: usize = 32;

/// EC-Cache's placement: `width` distinct random nodes, in distinct domains while domains last.
pub struct Random<R: Rng + Send> {
    rng: R,
}

impl<R: Rng + Send> Random<R> {
    pub fn new(rng: R) -> Self {
        Random { rng }
    }
}

impl<R: Rng + Send> Placement for Random<R> {
    fn place(&mut self, candidates: &[NodeLoad], width: usize) -> Result<Placed, PlacementError> {
        let mut chosen: Vec<usize> = Vec::with_capacity(width);
        let mut domains: Vec<DomainKey<'_>> = Vec::with_capacity(width);
        if !candidates.is_empty() {
            for _ in 0..width * ATTEMPTS_PER_NODE {
                if chosen.len() == width {
                    break;
                }
                let position = self.rng.gen_range(0..candidates.len());
                let node = &candidates[position];
                if node.slabs_free > 0 && !chosen.contains(&position) && !domains.contains(&domain_key(node))
                {
                    chosen.push(position);
                    domains.push(domain_key(node));
                }
            }
        }
        if chosen.len() == width {
            let nodes = chosen.iter().map(|&position| candidates[position].node_index).collect();
            return Ok(Placed { nodes, distinct_domains: true });
        }
        // Exact path: a random order, then one node per domain while domains last.
        let mut usable: Vec<&NodeLoad> = candidates.iter().filter(|n| n.slabs_free > 0).collect();
        if usable.len() < width {
            return Err(PlacementError::NotEnoughNodes { width, available: usable.len() });
        }
        usable.shuffle(&mut self.rng);
        Ok(take_spread(&usable, width))
    }
}

/// Power-of-two choices per split (seed 000 §7.2): for each of the `width` splits, two random
/// distinct eligible nodes, and the less loaded one (ties at random) takes the split. A node is
/// eligible when it has a free slab, is not chosen yet, and its domain is among the least used
/// so far (every domain once before any twice).
pub struct PowerOfTwo<R: Rng + Send> {
    rng: R,
}

impl<R: Rng + Send> PowerOfTwo<R> {
    pub fn new(rng: R) -> Self {
        PowerOfTwo { rng }
    }

    /// One random position whose node is usable, not chosen and in an unused domain; `None` after
    /// too many rejections.
    fn sample_fresh(
        &mut self,
        candidates: &[NodeLoad],
        chosen: &[usize],
        domains: &[DomainKey<'_>],
        other: Option<usize>,
    ) -> Option<usize> {
        for _ in 0..ATTEMPTS_PER_NODE {
            let position = self.rng.gen_range(0..candidates.len());
            let node = &candidates[position];
            if node.slabs_free > 0
                && Some(position) != other
                && !chosen.contains(&position)
                && !domains.contains(&domain_key(node))
            {
                return Some(position);
            }
        }
        None
    }

    fn better(&mut self, candidates: &[NodeLoad], a: usize, b: usize) -> usize {
        let (load_a, load_b) = (candidates[a].slabs_mapped, candidates[b].slabs_mapped);
        if load_a < load_b || (load_a == load_b && self.rng.gen_bool(0.5)) {
            a
        } else {
            b
        }
    }

    /// Exact path: for each split, the eligible nodes are listed in full.
    fn place_exact(&mut self, candidates: &[NodeLoad], width: usize) -> Result<Placed, PlacementError> {
        let usable: Vec<usize> = (0..candidates.len()).filter(|&p| candidates[p].slabs_free > 0).collect();
        if usable.len() < width {
            return Err(PlacementError::NotEnoughNodes { width, available: usable.len() });
        }
        let mut chosen: Vec<usize> = Vec::with_capacity(width);
        let mut domain_uses: HashMap<DomainKey<'_>, usize> = HashMap::new();
        for _ in 0..width {
            let uses = |p: &usize| domain_uses.get(&domain_key(&candidates[*p])).copied().unwrap_or(0);
            let open: Vec<usize> = usable.iter().copied().filter(|p| !chosen.contains(p)).collect();
            let least = open.iter().map(uses).min().expect("usable.len() >= width");
            let eligible: Vec<usize> = open.into_iter().filter(|p| uses(p) == least).collect();
            let pick = if eligible.len() == 1 {
                eligible[0]
            } else {
                let mut two = eligible.choose_multiple(&mut self.rng, 2);
                let (a, b) = (*two.next().expect("two eligible"), *two.next().expect("two eligible"));
                self.better(candidates, a, b)
            };
            chosen.push(pick);
            *domain_uses.entry(domain_key(&candidates[pick])).or_insert(0) += 1;
        }
        let distinct_domains = domain_uses.values().all(|&count| count == 1);
        Ok(Placed { nodes: chosen.iter().map(|&p| candidates[p].node_index).collect(), distinct_domains })
    }
}

impl<R: Rng + Send> Placement for PowerOfTwo<R> {
    fn place(&mut self, candidates: &[NodeLoad], width: usize) -> Result<Placed, PlacementError> {
        let mut chosen: Vec<usize> = Vec::with_capacity(width);
        let mut domains: Vec<DomainKey<'_>> = Vec::with_capacity(width);
        if !candidates.is_empty() {
            while chosen.len() < width {
                let Some(a) = self.sample_fresh(candidates, &chosen, &domains, None) else { break };
                let Some(b) = self.sample_fresh(candidates, &chosen, &domains, Some(a)) else { break };
                let pick = self.better(candidates, a, b);
                chosen.push(pick);
                domains.push(domain_key(&candidates[pick]));
            }
        }
        if chosen.len() == width {
            let nodes = chosen.iter().map(|&position| candidates[position].node_index).collect();
            return Ok(Placed { nodes, distinct_domains: true });
        }
        self.place_exact(candidates, width)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn cluster(domains: &[u8], loads: &[u64]) -> Vec<NodeLoad> {
        domains
            .iter()
            .zip(loads)
            .enumerate()
            .map(|(i, (d, l))| NodeLoad {
                node_index: i,
                failure_domain: format!("d{d}"),
                slabs_mapped: *l,
                slabs_free: 1,
            })
            .collect()
    }

    #[test]
    fn power_of_two_never_takes_the_most_loaded_of_two() {
        // Two usable nodes, width 1: the choice is always between both, so the lighter wins.
        let candidates = cluster(&[0, 1], &[9, 1]);
        let mut policy = PowerOfTwo::new(StdRng::seed_from_u64(1));
        for _ in 0..50 {
            assert_eq!(policy.place(&candidates, 1).unwrap().nodes, vec![1]);
        }
    }

    #[test]
    fn random_falls_back_when_domains_run_out() {
        // Three domains, width 4: one domain repeats, and the caller is told.
        let candidates = cluster(&[0, 0, 1, 1, 2, 2], &[0; 6]);
        let placed = Random::new(StdRng::seed_from_u64(2)).place(&candidates, 4).unwrap();
        assert!(!placed.distinct_domains);
        let mut nodes = placed.nodes.clone();
        nodes.sort_unstable();
        nodes.dedup();
        assert_eq!(nodes.len(), 4);
    }

    #[test]
    fn full_nodes_are_never_chosen() {
        let mut candidates = cluster(&[0, 1, 2, 3], &[0; 4]);
        candidates[2].slabs_free = 0;
        for seed in 0..20 {
            let placed = Random::new(StdRng::seed_from_u64(seed)).place(&candidates, 3).unwrap();
            assert!(!placed.nodes.contains(&2));
            let placed = PowerOfTwo::new(StdRng::seed_from_u64(seed)).place(&candidates, 3).unwrap();
            assert!(!placed.nodes.contains(&2));
        }
        let error = PowerOfTwo::new(StdRng::seed_from_u64(0)).place(&candidates, 4).unwrap_err();
        assert_eq!(error, PlacementError::NotEnoughNodes { width: 4, available: 3 });
    }

    proptest! {
        #[test]
        fn random_and_power_of_two_are_distinct_spread_and_deterministic(
            domain_ids in proptest::collection::vec(0u8..8, 1..40),
            full in proptest::collection::vec(any::<bool>(), 40),
            width in 1usize..12,
            seed in any::<u64>(),
        ) {
            let mut candidates = cluster(&domain_ids, &vec![0; domain_ids.len()]);
            for (i, node) in candidates.iter_mut().enumerate() {
                node.slabs_mapped = (i as u64 * 7) % 5;
                node.slabs_free = u64::from(!full[i]);
            }
            let usable: Vec<&NodeLoad> = candidates.iter().filter(|n| n.slabs_free > 0).collect();
            let usable_domains: std::collections::HashSet<_> = usable.iter().map(|n| &n.failure_domain).collect();
            for kind in 0..2 {
                let place = |seed| -> Result<Placed, PlacementError> {
                    if kind == 0 {
                        Random::new(StdRng::seed_from_u64(seed)).place(&candidates, width)
                    } else {
                        PowerOfTwo::new(StdRng::seed_from_u64(seed)).place(&candidates, width)
                    }
                };
                let result = place(seed);
                prop_assert_eq!(&result, &place(seed));
                if usable.len() < width {
                    prop_assert!(result.is_err());
                    continue;
                }
                let placed = result.unwrap();
                let mut sorted = placed.nodes.clone();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), width);
                prop_assert!(placed.nodes.iter().all(|&n| candidates[n].slabs_free > 0));
                prop_assert_eq!(placed.distinct_domains, usable_domains.len() >= width);
            }
        }
    }
}
