//! Hooks for whoever counts the file system's work (`remem fs --metrics`): each FUSE request
//! the file system answers is reported once, with its kind, the bytes it moved, how long it took
//! and whether it failed.
//!
//! The crate knows no metrics format and keeps no counters itself: an observer is called on the
//! request thread, after the request's work and before its reply, so it must be cheap (relaxed
//! atomics, no lock shared with other threads, no allocation). Without an observer the requests
//! do not even read the clock.

use std::time::Duration;

/// The kinds of request an observer is told of. `mknod` of a regular file counts as `Create`;
/// `fsyncdir` as `Fsync`; `flush` and the extended-attribute requests (answered without work)
/// are not reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileOp {
    Lookup,
    Getattr,
    Setattr,
    Access,
    Readlink,
    Create,
    Mkdir,
    Symlink,
    Link,
    Unlink,
    Rmdir,
    Rename,
    Open,
    Release,
    Read,
    Write,
    Fsync,
    Fallocate,
    Readdir,
    Statfs,
}

impl FileOp {
    /// Every kind, in the order of [`FileOp::index`].
    pub const ALL: [FileOp; 20] = [
        FileOp::Lookup,
        FileOp::Getattr,
        FileOp::Setattr,
        FileOp::Access,
        FileOp::Readlink,
        FileOp::Create,
        FileOp::Mkdir,
        FileOp::Symlink,
        FileOp::Link,
        FileOp::Unlink,
        FileOp::Rmdir,
        FileOp::Rename,
        FileOp::Open,
        FileOp::Release,
        FileOp::Read,
        FileOp::Write,
        FileOp::Fsync,
        FileOp::Fallocate,
        FileOp::Readdir,
        FileOp::Statfs,
    ];

    /// A dense index in `0..ALL.len()`, for tables of counters.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The lower-case name of the request (a label value).
    pub fn name(self) -> &'static str {
        match self {
            FileOp::Lookup => "lookup",
            FileOp::Getattr => "getattr",
            FileOp::Setattr => "setattr",
            FileOp::Access => "access",
            FileOp::Readlink => "readlink",
            FileOp::Create => "create",
            FileOp::Mkdir => "mkdir",
            FileOp::Symlink => "symlink",
            FileOp::Link => "link",
            FileOp::Unlink => "unlink",
            FileOp::Rmdir => "rmdir",
            FileOp::Rename => "rename",
            FileOp::Open => "open",
            FileOp::Release => "release",
            FileOp::Read => "read",
            FileOp::Write => "write",
            FileOp::Fsync => "fsync",
            FileOp::Fallocate => "fallocate",
            FileOp::Readdir => "readdir",
            FileOp::Statfs => "statfs",
        }
    }
}

/// Told of every request the file system answered (see the module docs for the cost rules).
pub trait FileOpObserver: Send + Sync + std::fmt::Debug {
    /// `op` took `latency` (from the request's arrival at the file system to its answer, the
    /// wait for the file system's lock included); `bytes` is what a read returned or a write
    /// took (0 for the other kinds); `failed` when the reply was an error.
    fn file_op(&self, op: FileOp, bytes: u64, latency: Duration, failed: bool);
}

#[cfg(test)]
mod tests {
    use super::FileOp;

    #[test]
    fn indexes_follow_the_table_and_names_are_distinct() {
        for (position, op) in FileOp::ALL.iter().enumerate() {
            assert_eq!(op.index(), position, "{op:?}");
        }
        let mut names: Vec<&str> = FileOp::ALL.iter().map(|op| op.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FileOp::ALL.len());
    }
}
