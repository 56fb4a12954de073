//! Coding parameters of one page: how many data and parity splits, and how big the page is.
//!
//! Invariants of a constructed [`CodecParams`] (checked once, in [`CodecParams::new`], so the
//! coders can rely on them without re-checking):
//! - `1 <= data_splits <= MAX_DATA_SPLITS` and `parity_splits <= MAX_PARITY_SPLITS`, so the
//!   `k + r <= 20` split indices fit in a `u32` presence mask;
//! - `page_bytes` is a power of two in `MIN_PAGE_BYTES..=MAX_PAGE_BYTES`;
//! - `data_splits` divides `page_bytes`, so every split has the same size and the data splits tile
//!   the page exactly. With a power-of-two page this means `data_splits` is a power of two too
//!   (1, 2, 4, 8 or 16): k = 3 is rejected rather than padded.

/// Largest number of data splits (k). ISA-L's pointer arrays are sized for this on the stack.
pub const MAX_DATA_SPLITS: usize = 16;
/// Largest number of parity splits (r): the number of simultaneous failures a page survives.
pub const MAX_PARITY_SPLITS: usize = 4;
/// Largest total number of splits (k + r); split indices are bits of a `u32` mask.
pub const MAX_TOTAL_SPLITS: usize = MAX_DATA_SPLITS + MAX_PARITY_SPLITS;
/// Smallest page: the 4 KiB page of the Hydra paper.
pub const MIN_PAGE_BYTES: usize = 4096;
/// Largest page. ISA-L takes split lengths as a C `int`; 1 GiB keeps every split far below that.
pub const MAX_PAGE_BYTES: usize = 1 << 30;

/// How one page is coded: k data splits of `page_bytes / k` bytes each, plus r parity splits of
/// the same size. Build it with [`CodecParams::new`], which validates every field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodecParams {
    pub data_splits: usize,
    pub parity_splits: usize,
    pub page_bytes: usize,
}

/// Why a set of coding parameters was refused by [`CodecParams::new`].
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ParamsError {
    #[error("data_splits must be in 1..={max}, got {data_splits}")]
    DataSplitsOutOfRange { data_splits: usize, max: usize },
    #[error("parity_splits must be in 0..={max}, got {parity_splits}")]
    ParitySplitsOutOfRange { parity_splits: usize, max: usize },
    #[error("page_bytes must be a power of two in {min}..={max}, got {page_bytes}")]
    PageBytesInvalid { page_bytes: usize, min: usize, max: usize },
    #[error(
        "data_splits ({data_splits}) must divide page_bytes ({page_bytes}) so that all splits \
         have the same size; with a power-of-two page use k = 1, 2, 4, 8 or 16"
    )]
    SplitsDoNotDividePage { data_splits: usize, page_bytes: usize },
}

impl CodecParams {
    /// Validates and builds coding parameters.
    ///
    /// # Errors
    /// [`ParamsError`] names the first field out of range; see the module docs for the rules.
    pub fn new(data_splits: usize, parity_splits: usize, page_bytes: usize) -> Result<Self, ParamsError> {
        if !(1..=MAX_DATA_SPLITS).contains(&data_splits) {
            return Err(ParamsError::DataSplitsOutOfRange { data_splits, max: MAX_DATA_SPLITS });
        }
        if parity_splits > MAX_PARITY_SPLITS {
            return Err(ParamsError::ParitySplitsOutOfRange { parity_splits, max: MAX_PARITY_SPLITS });
        }
        if !page_bytes.is_power_of_two() || !(MIN_PAGE_BYTES..=MAX_PAGE_BYTES).contains(&page_bytes) {
            return Err(ParamsError::PageBytesInvalid {
                page_bytes,
                min: MIN_PAGE_BYTES,
                max: MAX_PAGE_BYTES,
            });
        }
        if page_bytes % data_splits != 0 {
            return Err(ParamsError::SplitsDoNotDividePage { data_splits, page_bytes });
        }
        Ok(Self { data_splits, parity_splits, page_bytes })
    }

    /// Bytes in one split (data or parity): `page_bytes / data_splits`.
    pub fn split_bytes(&self) -> usize {
        self.page_bytes / self.data_splits
    }

    /// Number of splits a page is stored as: `data_splits + parity_splits`.
    pub fn total_splits(&self) -> usize {
        self.data_splits + self.parity_splits
    }

    /// Bytes of the parity buffer that goes with one page: `parity_splits * split_bytes`.
    pub fn parity_bytes(&self) -> usize {
        self.parity_splits * self.split_bytes()
    }

    /// The presence mask with every split of this page set.
    pub fn all_splits_mask(&self) -> u32 {
        mask_of_first(self.total_splits())
    }

    /// The presence mask with every data split set (parities clear).
    pub fn data_splits_mask(&self) -> u32 {
        mask_of_first(self.data_splits)
    }
}

/// Mask with bits `0..count` set; `count <= MAX_TOTAL_SPLITS < 32`.
fn mask_of_first(count: usize) -> u32 {
    assert!(count <= MAX_TOTAL_SPLITS);
    (1u32 << count) - 1
}
