//! A front end's state directory, locked: created 0700 when missing, and held with `flock` on its
//! `lock` file (which names the holder's PID) for as long as the [`LockedDir`] lives. `remem fs`
//! (`remem_fs::persist::StateDir`) and `remem kv` (its `KvState`) keep their saved state in one,
//! so two servers never write one directory's files at once.
//!
//! The lock is advisory and per open file description: the kernel drops it when the process
//! dies, however it dies, so a SIGKILLed server never leaves a directory locked.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The lock file inside a state directory.
pub const LOCK_FILE: &str = "lock";

/// Why a state directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// Another process holds the lock; `holder` is the PID it wrote (at most 20 characters, as
    /// read: input, not trusted).
    #[error("state directory {path} is in use by another process (pid {holder})")]
    Locked { path: PathBuf, holder: String },
}

/// A state directory, locked for this process for as long as this value lives.
pub struct LockedDir {
    path: PathBuf,
    _lock: File,
}

impl LockedDir {
    /// Creates (0700) and locks the directory. Errors: I/O, or `Locked` when another process
    /// holds it.
    pub fn open(path: &Path) -> Result<LockedDir, LockError> {
        let io_error = |path: &Path| {
            let path = path.to_owned();
            move |source| LockError::Io { path, source }
        };
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(io_error(path))?;
        let lock_path = path.join(LOCK_FILE);
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_error(&lock_path))?;
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = lock.read_to_string(&mut holder);
                let holder = holder.trim().chars().take(20).collect();
                return Err(LockError::Locked { path: path.to_owned(), holder });
            }
            return Err(LockError::Io { path: lock_path, source: error });
        }
        lock.set_len(0).map_err(io_error(&lock_path))?;
        let _ = write!(lock, "{}", std::process::id());
        Ok(LockedDir { path: path.to_owned(), _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_directory_refuses_a_second_holder_until_dropped() {
        let path = std::env::temp_dir().join(format!("remem-locked-dir-{}", std::process::id()));
        let first = LockedDir::open(&path).expect("first");
        match LockedDir::open(&path) {
            Err(LockError::Locked { holder, .. }) => assert_eq!(holder, std::process::id().to_string()),
            Err(error) => panic!("expected Locked, got {error}"),
            Ok(_) => panic!("a second lock of a held directory"),
        }
        drop(first);
        let again = LockedDir::open(&path).expect("free again");
        assert_eq!(again.path(), path);
        drop(again);
        std::fs::remove_dir_all(&path).expect("cleanup");
    }
}
