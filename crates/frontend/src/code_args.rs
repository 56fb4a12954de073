//! `-k`, `-r`, `--delta`: the erasure code of a command's client, shared by the commands that
//! take one (`demo`, `nbd`, `fs`, `swap`, `run`, `kv`, `bench codec`), with the one definition of
//! their limits: the codec's ([`MAX_DATA_SPLITS`], [`MAX_PARITY_SPLITS`]), checked when the
//! flags are parsed, before anything connects.

use anyhow::{bail, Result};
use clap::Args;
use remem_client::Shape;
use remem_codec::{MAX_DATA_SPLITS, MAX_PARITY_SPLITS};

#[derive(Args, Clone, Debug)]
pub struct CodeArgs {
    /// Data splits per page (k).
    #[arg(long, short = 'k', default_value_t = 8, value_parser = parse_data_splits)]
    pub data_splits: usize,
    /// Parity splits per page (r): pages survive r failed nodes.
    #[arg(long, short = 'r', default_value_t = 2, value_parser = parse_parity_splits)]
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

/// `-k`: 1 to [`MAX_DATA_SPLITS`] data splits.
pub fn parse_data_splits(text: &str) -> Result<usize, String> {
    parse_splits(text, 1, MAX_DATA_SPLITS, "k")
}

/// `-r`: 0 to [`MAX_PARITY_SPLITS`] parity splits.
pub fn parse_parity_splits(text: &str) -> Result<usize, String> {
    parse_splits(text, 0, MAX_PARITY_SPLITS, "r")
}

fn parse_splits(text: &str, min: usize, max: usize, name: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(count) if (min..=max).contains(&count) => Ok(count),
        Ok(count) => Err(format!("{count}: {name} must be between {min} and {max} (the codec's limits)")),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_counts_are_checked_against_the_codec() {
        assert!(parse_data_splits("0").is_err() && parse_data_splits("17").is_err());
        assert_eq!(parse_data_splits("16"), Ok(16));
        assert_eq!(parse_parity_splits("0"), Ok(0));
        assert!(parse_parity_splits("5").is_err() && parse_parity_splits("x").is_err());
        let params = remem_codec::CodecParams::new(MAX_DATA_SPLITS, MAX_PARITY_SPLITS, 4096);
        assert!(params.is_ok(), "the largest shape the flags admit is one the codec takes");
    }
}
