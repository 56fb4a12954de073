//! `-k`, `-r`, `--delta`: the erasure code of a command's client, shared by the commands that
//! take one (`demo`, `nbd`).

use anyhow::{bail, Result};
use clap::Args;
use remem_client::Shape;

#[derive(Args, Clone, Debug)]
pub struct CodeArgs {
    /// Data splits per page (k).
    #[arg(long, short = 'k', default_value_t = 8, value_parser = remem_local::units::parse_data_splits)]
    pub data_splits: usize,
    /// Parity splits per page (r): pages survive r failed nodes.
    #[arg(long, short = 'r', default_value_t = 2)]
    pub parity_splits: usize,
    /// Extra splits read beyond k (delta, at most r), for stragglers.
    #[arg(long, default_value_t = 1)]
    pub delta: usize,
}

impl CodeArgs {
    /// The shape these flags give. Errors when delta exceeds r.
    pub fn shape(&self) -> Result<Shape> {
        if self.delta > self.parity_splits {
            bail!("--delta ({}) cannot exceed --parity-splits ({})", self.delta, self.parity_splits);
        }
        Ok(Shape {
            data_splits: self.data_splits,
            parity_splits: self.parity_splits,
            extra_reads: self.delta,
        })
    }
}
