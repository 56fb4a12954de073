//! Placement: which nodes hold the k+r slabs of an address range.
//!
//! The client asks a [`Placement`] policy for `width` distinct nodes each time it maps a new
//! address range (and, later, when a slab must be rebuilt elsewhere). Policies see only a
//! snapshot of the candidate nodes ([`NodeLoad`]); they do no I/O, so the simulator
//! (`remem-sim`) runs the exact code the cluster runs.
//!
//! Policies:
//! - [`LeastLoaded`]: the `width` least-loaded nodes of the whole cluster (the core's policy).
//! - [`CodingSets`]: seed 000 section 5.1. Nodes form disjoint extended groups of
//!   `width + l` nodes; a range goes to one group and takes its `width` least-loaded members.
//!   The group is chosen at random (the seed), by power-of-two choices or least loaded
//!   ([`GroupChoice`]). Membership rules are in the `coding_sets` module.
//! - [`Random`]: `width` random nodes (EC-Cache).
//! - [`PowerOfTwo`]: per split, the less loaded of two random nodes.
//!
//! Invariants every policy keeps:
//! - the returned nodes are distinct and have a free slab;
//! - when the candidates span at least `width` failure domains, the returned nodes are in
//!   distinct failure domains; otherwise domains repeat as little as possible and the
//!   caller is told through [`Placed::distinct_domains`] (CodingSets keeps this within the
//!   chosen group: its groups are formed with distinct domains where the cluster allows);
//! - given the same seed and the same sequence of calls, the same decisions.

mod coding_sets;
mod named;
mod random;

pub use coding_sets::{CodingSets, GroupChoice, MembershipChange};
pub use named::Policy;
pub use random::{PowerOfTwo, Random};

use std::collections::HashMap;

use rand::seq::SliceRandom;
use rand::Rng;

/// What a policy knows about one candidate node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLoad {
    /// Index of the node in the caller's node list; returned as is.
    pub node_index: usize,
    /// Failure domain label (rack, host...). Empty means "a domain of its own".
    pub failure_domain: String,
    /// Slabs currently mapped on the node (any client).
    pub slabs_mapped: u64,
    /// Slabs the node can still map.
    pub slabs_free: u64,
}

/// A placement decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Node indices, one per split, in split order.
    pub nodes: Vec<usize>,
    /// True when every chosen node is in a different failure domain.
    pub distinct_domains: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    /// Fewer than `width` usable nodes (for CodingSets: in the best group).
    #[error("placement needs {width} nodes with a free slab, only {available} have one")]
    NotEnoughNodes { width: usize, available: usize },
    /// A CodingSets policy forms its groups for one width; a client uses one code.
    #[error("placement groups were formed for width {formed_for}, asked for width {asked}")]
    WidthChanged { formed_for: usize, asked: usize },
}

/// A slab placement policy.
pub trait Placement: Send {
    /// Chooses `width` distinct nodes among `candidates` (nodes without a free slab are
    /// ignored). Errors when fewer than `width` nodes can take a slab.
    fn place(&mut self, candidates: &[NodeLoad], width: usize) -> Result<Placed, PlacementError>;

    /// Chooses the node that takes over one slab of a range whose slabs are now on `current`
    /// (the lost node included), for a rebuild. `candidates` are the live nodes of the cluster
    /// (a dead node is absent); the result is never in `current`. The default takes the least
    /// loaded node, preferring a failure domain the range does not use yet; CodingSets keeps the
    /// range inside its extended group unless that would put the slab in a domain the range uses.
    ///
    /// Errors: `NotEnoughNodes { width: 1, .. }` when no candidate outside `current` has a free
    /// slab.
    fn replace(&mut self, candidates: &[NodeLoad], current: &[usize]) -> Result<usize, PlacementError> {
        least_loaded_outside(candidates, current, |_| true)
    }
}

/// The least-loaded candidate with a free slab, not in `current`, among those `eligible` admits;
/// one in a failure domain that `current` does not use is preferred. The lowest node index wins
/// ties, so a replacement is deterministic.
pub(crate) fn least_loaded_outside(
    candidates: &[NodeLoad],
    current: &[usize],
    eligible: impl Fn(usize) -> bool,
) -> Result<usize, PlacementError> {
    pick_outside(candidates, current, eligible, false)
}

/// As [`least_loaded_outside`], but only in a failure domain `current` does not use.
pub(crate) fn least_loaded_in_new_domain(
    candidates: &[NodeLoad],
    current: &[usize],
    eligible: impl Fn(usize) -> bool,
) -> Result<usize, PlacementError> {
    pick_outside(candidates, current, eligible, true)
}

fn pick_outside(
    candidates: &[NodeLoad],
    current: &[usize],
    eligible: impl Fn(usize) -> bool,
    new_domain_only: bool,
) -> Result<usize, PlacementError> {
    let used_domains: Vec<DomainKey<'_>> =
        candidates.iter().filter(|node| current.contains(&node.node_index)).map(domain_key).collect();
    candidates
        .iter()
        .map(|node| (node, used_domains.contains(&domain_key(node))))
        .filter(|&(node, used)| {
            node.slabs_free > 0
                && !current.contains(&node.node_index)
                && !(new_domain_only && used)
                && eligible(node.node_index)
        })
        .min_by_key(|&(node, used)| (used, node.slabs_mapped, node.node_index))
        .map(|(node, _)| node.node_index)
        .ok_or(PlacementError::NotEnoughNodes { width: 1, available: 0 })
}

/// The simple policy of the core: least loaded first, one node per failure domain while
/// domains last, ties broken at random so that equal nodes share the load.
/// Every call sorts all candidates: O(N log N) per range.
pub struct LeastLoaded<R: Rng + Send> {
    rng: R,
}

impl<R: Rng + Send> LeastLoaded<R> {
    pub fn new(rng: R) -> Self {
        LeastLoaded { rng }
    }
}

impl<R: Rng + Send> Placement for LeastLoaded<R> {
    fn place(&mut self, candidates: &[NodeLoad], width: usize) -> Result<Placed, PlacementError> {
        let mut usable: Vec<&NodeLoad> = candidates.iter().filter(|n| n.slabs_free > 0).collect();
        if usable.len() < width {
            return Err(PlacementError::NotEnoughNodes { width, available: usable.len() });
        }
        // Shuffle first so that the stable sort leaves equal loads in random order.
        usable.shuffle(&mut self.rng);
        usable.sort_by_key(|n| n.slabs_mapped);
        Ok(take_spread(&usable, width))
    }
}

/// Takes `width` nodes from `ordered` (best first), one per failure domain while domains last.
/// Round by round it admits nodes whose domain has been used at most `round` times: in round 0
/// every domain appears once, so domains repeat only when there are too few of them.
pub(crate) fn take_spread(ordered: &[&NodeLoad], width: usize) -> Placed {
    assert!(ordered.len() >= width, "caller checked that enough nodes are usable");
    let mut chosen: Vec<usize> = Vec::with_capacity(width);
    let mut taken = vec![false; ordered.len()];
    let mut domains_used: HashMap<DomainKey<'_>, usize> = HashMap::new();
    let mut round = 0;
    while chosen.len() < width {
        for (position, node) in ordered.iter().enumerate() {
            if chosen.len() == width {
                break;
            }
            if taken[position] {
                continue;
            }
            let key = domain_key(node);
            let used = domains_used.get(&key).copied().unwrap_or(0);
            if used <= round {
                chosen.push(node.node_index);
                taken[position] = true;
                *domains_used.entry(key).or_insert(0) += 1;
            }
        }
        round += 1;
        assert!(round <= width + 1, "placement loop must finish: ordered.len() >= width");
    }
    let distinct_domains = domains_used.values().all(|&count| count == 1);
    Placed { nodes: chosen, distinct_domains }
}

/// A failure domain's identity. Nodes without a label are each their own domain, as
/// [`NodeLoad::failure_domain`] promises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum DomainKey<'a> {
    Named(&'a str),
    Alone(usize),
}

pub(crate) fn domain_key(node: &NodeLoad) -> DomainKey<'_> {
    if node.failure_domain.is_empty() {
        DomainKey::Alone(node.node_index)
    } else {
        DomainKey::Named(&node.failure_domain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn nodes(domains: &[&str], loads: &[u64]) -> Vec<NodeLoad> {
        domains
            .iter()
            .zip(loads)
            .enumerate()
            .map(|(i, (d, l))| NodeLoad {
                node_index: i,
                failure_domain: d.to_string(),
                slabs_mapped: *l,
                slabs_free: 4,
            })
            .collect()
    }

    #[test]
    fn picks_least_loaded_distinct_nodes() {
        let candidates = nodes(&["a", "b", "c", "d"], &[5, 0, 1, 9]);
        let placed = LeastLoaded::new(StdRng::seed_from_u64(1)).place(&candidates, 3).unwrap();
        assert_eq!(placed.nodes, vec![1, 2, 0]);
        assert!(placed.distinct_domains);
    }

    #[test]
    fn spreads_over_domains_before_load() {
        // Nodes 0 and 1 share domain "a"; with 3 domains and width 3 each domain appears once.
        let candidates = nodes(&["a", "a", "b", "c"], &[0, 0, 5, 6]);
        let placed = LeastLoaded::new(StdRng::seed_from_u64(2)).place(&candidates, 3).unwrap();
        assert!(placed.distinct_domains);
        assert!(placed.nodes.contains(&2) && placed.nodes.contains(&3));
    }

    #[test]
    fn replacement_is_outside_the_range_in_a_new_domain_and_least_loaded() {
        let candidates = nodes(&["a", "b", "c", "c", "d"], &[0, 0, 0, 1, 3]);
        let mut policy = LeastLoaded::new(StdRng::seed_from_u64(4));
        // Range on 0, 1, 2: node 3 is least loaded outside but shares domain "c"; 4 does not.
        assert_eq!(policy.replace(&candidates, &[0, 1, 2]), Ok(4));
        assert_eq!(policy.replace(&candidates, &[0, 1, 2, 4]), Ok(3));
        assert!(policy.replace(&candidates, &[0, 1, 2, 3, 4]).is_err());
    }

    #[test]
    fn too_few_nodes_is_an_error() {
        let mut candidates = nodes(&["a", "b", "c"], &[0, 0, 0]);
        candidates[1].slabs_free = 0;
        let error = LeastLoaded::new(StdRng::seed_from_u64(3)).place(&candidates, 3).unwrap_err();
        assert_eq!(error, PlacementError::NotEnoughNodes { width: 3, available: 2 });
    }

    proptest! {
        #[test]
        fn placement_is_distinct_and_domain_spread(
            domain_ids in proptest::collection::vec(0u8..6, 1..24),
            width in 1usize..12,
            seed in any::<u64>(),
        ) {
            let candidates: Vec<NodeLoad> = domain_ids.iter().enumerate().map(|(i, d)| NodeLoad {
                node_index: i, failure_domain: format!("d{d}"), slabs_mapped: (i as u64 * 7) % 5, slabs_free: 1,
            }).collect();
            let result = LeastLoaded::new(StdRng::seed_from_u64(seed)).place(&candidates, width);
            if candidates.len() < width {
                prop_assert!(result.is_err());
            } else {
                let placed = result.unwrap();
                let mut sorted = placed.nodes.clone();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), width);
                let distinct_domains: std::collections::HashSet<_> = domain_ids.iter().collect();
                prop_assert_eq!(placed.distinct_domains, distinct_domains.len() >= width);
            }
        }
    }
}
