//! `--placement`: the slab placement policy of a command's client, by the names of
//! `remem_placement::Policy`, which `remem sim` uses too, so that what the simulator measures is
//! what the cluster runs.

use clap::Args;
use remem_placement::{Placement, Policy};

#[derive(Args, Clone, Debug)]
pub struct PlacementArgs {
    /// Slab placement: codingsets-p2c (CodingSets, extended group by power-of-two choices),
    /// codingsets (group at random, as in the seed), codingsets-least, ec-cache (random),
    /// p2c-slab (power of two per slab) or least-loaded. See docs/PLACEMENT.md.
    #[arg(long, default_value = "codingsets-p2c", value_parser = policy_parser())]
    pub placement: Policy,
    /// CodingSets' load-balancing factor l: extended groups have k+r+l nodes.
    #[arg(long, default_value_t = 2)]
    pub load_balancing_factor: usize,
    /// Accept ranges with more than r splits in one failure domain when the cluster's domains
    /// allow no better (losing that domain then loses data). Without it such a start is refused,
    /// naming the -k that fits.
    #[arg(long)]
    pub allow_shared_domains: bool,
}

impl PlacementArgs {
    pub fn build(&self, seed: u64) -> Box<dyn Placement> {
        self.placement.build(seed, self.load_balancing_factor)
    }
}

/// The policies by name, listed for clap (its errors, `--help`, completion scripts).
fn policy_parser() -> impl clap::builder::TypedValueParser<Value = Policy> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Policy::ALL.map(Policy::name))
        .map(|name: String| Policy::parse(&name).expect("clap admits only the listed names"))
}
