//! Placement: which nodes hold the k+r slabs of an address range.
//!
//! The client asks a [`Placement`] policy for `width` distinct nodes each time it maps a new
//! address range (and, later, when a slab must be rebuilt elsewhere). Policies see only a
//! snapshot of the candidate nodes ([`NodeLoad`]); they do no I/O, so the simulator can run the
//! exact code the cluster runs.
//!
//! Invariants every policy keeps:
//! - the returned nodes are distinct;
//! - when the candidates span at least `width` failure domains, the returned nodes are in
//!   distinct failure domains; otherwise domains repeat as little as possible and the
//!   caller is told through [`Placed::distinct_domains`].

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
    #[error("placement needs {width} nodes with a free slab, only {available} have one")]
    NotEnoughNodes { width: usize, available: usize },
}

/// A slab placement policy.
pub trait Placement: Send {
    /// Chooses `width` distinct nodes among `candidates` (nodes without a free slab are
    /// ignored). Errors when fewer than `width` nodes can take a slab.
    fn place(&mut self, candidates: &[NodeLoad], width: usize) -> Result<Placed, PlacementError>;
}

/// The simple policy of the core: least loaded first, one node per failure domain while
/// domains last, ties broken at random so that equal nodes share the load.
/// CodingSets comes with the Resource Monitor issue behind the same trait.
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

        let mut chosen: Vec<usize> = Vec::with_capacity(width);
        let mut domains_used: HashMap<&str, usize> = HashMap::new();
        // Round by round, admit nodes whose domain has been used at most `round` times: in round
        // 0 every domain appears once, so domains repeat only when there are too few of them.
        let mut round = 0;
        while chosen.len() < width {
            for node in &usable {
                if chosen.len() == width {
                    break;
                }
                if chosen.contains(&node.node_index) {
                    continue;
                }
                let key = domain_key(node);
                let used = domains_used.get(key).copied().unwrap_or(0);
                if used <= round {
                    chosen.push(node.node_index);
                    *domains_used.entry(key).or_insert(0) += 1;
                }
            }
            round += 1;
            assert!(round <= width + 1, "placement loop must finish: usable >= width");
        }
        let distinct_domains = domains_used.values().all(|&count| count == 1);
        Ok(Placed { nodes: chosen, distinct_domains })
    }
}

/// Nodes without a label are each their own domain.
fn domain_key(node: &NodeLoad) -> &str {
    &node.failure_domain
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
