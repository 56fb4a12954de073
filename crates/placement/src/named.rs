//! The named policies: what `--placement` and `remem sim` call each policy, and how each is
//! built with a seed, in one place, so the simulator measures what the cluster runs.

use crate::{CodingSets, GroupChoice, LeastLoaded, Placement, PowerOfTwo, Random};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// CodingSets with the seed's random group choice.
    CodingSets,
    /// CodingSets, group chosen by power-of-two choices on mean member load.
    CodingSetsPowerOfTwo,
    /// CodingSets, least-loaded group.
    CodingSetsLeastLoaded,
    /// EC-Cache: k+r random nodes.
    EcCache,
    /// Power-of-two choices per slab.
    PowerOfTwoPerSlab,
    /// The core's policy: the k+r least-loaded nodes of the cluster.
    LeastLoaded,
}

impl Policy {
    pub const ALL: [Policy; 6] = [
        Policy::CodingSets,
        Policy::CodingSetsPowerOfTwo,
        Policy::CodingSetsLeastLoaded,
        Policy::EcCache,
        Policy::PowerOfTwoPerSlab,
        Policy::LeastLoaded,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::CodingSets => "codingsets",
            Policy::CodingSetsPowerOfTwo => "codingsets-p2c",
            Policy::CodingSetsLeastLoaded => "codingsets-least",
            Policy::EcCache => "ec-cache",
            Policy::PowerOfTwoPerSlab => "p2c-slab",
            Policy::LeastLoaded => "least-loaded",
        }
    }

    pub fn parse(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }

    /// `parse`, or an error that lists the names.
    pub fn parse_or_list(name: &str) -> Result<Policy, String> {
        Policy::parse(name).ok_or_else(|| {
            let names: Vec<&str> = Policy::ALL.iter().map(|policy| policy.name()).collect();
            format!("unknown placement {name:?}; one of {}", names.join(", "))
        })
    }

    pub fn is_coding_sets(self) -> bool {
        matches!(self, Policy::CodingSets | Policy::CodingSetsPowerOfTwo | Policy::CodingSetsLeastLoaded)
    }

    /// Policies that look at every node for every range (O(N) per `place`); the sweeps keep
    /// them to clusters where that stays quick.
    pub fn scans_every_node(self) -> bool {
        matches!(self, Policy::CodingSetsLeastLoaded | Policy::LeastLoaded)
    }

    pub fn build(self, seed: u64, load_balancing_factor: usize) -> Box<dyn Placement> {
        let rng = StdRng::seed_from_u64(seed);
        match self {
            Policy::CodingSets => Box::new(CodingSets::new(rng, load_balancing_factor, GroupChoice::Random)),
            Policy::CodingSetsPowerOfTwo => {
                Box::new(CodingSets::new(rng, load_balancing_factor, GroupChoice::PowerOfTwo))
            }
            Policy::CodingSetsLeastLoaded => {
                Box::new(CodingSets::new(rng, load_balancing_factor, GroupChoice::LeastLoaded))
            }
            Policy::EcCache => Box::new(Random::new(rng)),
            Policy::PowerOfTwoPerSlab => Box::new(PowerOfTwo::new(rng)),
            Policy::LeastLoaded => Box::new(LeastLoaded::new(rng)),
        }
    }
}
