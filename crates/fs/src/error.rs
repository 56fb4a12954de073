//! Every error of the file system, and the one place where each becomes an errno.
//!
//! A remem page error is always `EIO`: a page that cannot be read correctly is an error, never
//! wrong bytes (docs/FS.md, SEMANTICS).

use remem_client::PageError;

/// Why a file system operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDirectory,
    #[error("is a directory")]
    IsDirectory,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("name longer than {max} bytes")]
    NameTooLong { max: usize },
    #[error("offset {offset} + {len} bytes is beyond the largest file ({max} bytes)")]
    TooLarge { offset: u64, len: u64, max: u64 },
    #[error("no space: {needed_pages} pages needed, {free_pages} free")]
    NoSpace { needed_pages: u64, free_pages: u64 },
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    #[error("remem: {0}")]
    Page(#[from] PageError),
    /// The metadata journal could not be written: the change is not durable, and no later
    /// change is accepted (docs/FS.md).
    #[error("metadata journal: {0}")]
    Journal(String),
}

impl FsError {
    /// The errno the kernel gets.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDirectory => libc::ENOTDIR,
            FsError::IsDirectory => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::NameTooLong { .. } => libc::ENAMETOOLONG,
            FsError::TooLarge { .. } => libc::EFBIG,
            FsError::NoSpace { .. } => libc::ENOSPC,
            FsError::Unsupported(_) => libc::EOPNOTSUPP,
            // Lost pages, failed writes, timeouts, refusals, even an out-of-range page (a bug
            // of ours, not the caller's): the data cannot be served correctly.
            FsError::Page(_) => libc::EIO,
            FsError::Journal(_) => libc::EIO,
        }
    }
}

impl From<crate::extents::NoSpace> for FsError {
    fn from(no_space: crate::extents::NoSpace) -> FsError {
        FsError::NoSpace { needed_pages: no_space.needed_pages, free_pages: no_space.free_pages }
    }
}

pub type FsResult<T> = Result<T, FsError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_remem_page_error_is_eio() {
        let lost = PageError::Lost {
            page: 1,
            range: 0,
            valid_splits: 7,
            needed_splits: 8,
            failed_nodes: Vec::new(),
        };
        assert_eq!(FsError::from(lost).errno(), libc::EIO);
        let timeout = PageError::Timeout { address: "127.0.0.1:1".parse().expect("address") };
        assert_eq!(FsError::from(timeout).errno(), libc::EIO);
        assert_eq!(FsError::NoSpace { needed_pages: 1, free_pages: 0 }.errno(), libc::ENOSPC);
    }
}
