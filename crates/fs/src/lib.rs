//! remem-fs: a FUSE file system whose file contents live in remem pages (`remem fs`,
//! docs/FS.md; seed 000's Remote Regions).
//!
//! - [`extents`]: the page allocator of the remem address space and each file's extent map.
//! - [`namespace`]: inodes, attributes, directories (metadata, in this process's memory).
//! - [`persist`]: the metadata on local disk (snapshot and journal in a state directory), so a
//!   restart finds every file.
//! - [`filesystem`] and `data`: the operations, over a [`PageStore`] (the remem client).
//! - `fuse`: the kernel's requests, checked, and their replies; [`error`] maps errors to errno.
//! - [`observe`]: the hook a metrics exporter hangs on the requests (the file system counts
//!   nothing).
//! - [`cli`]: the `remem fs` command (its arguments, the state directory, the client opened or
//!   reopened, the mount until a signal) and its metrics exporter and region report.
//!
//! Architecture Invariant: the crate uses only the remem client API, never the wire protocol,
//! and no other front end.
//! Every value from the kernel is checked before it sizes a buffer or addresses a page. A
//! page that cannot be read correctly is `EIO`, never other bytes.

pub mod batch;
pub mod cli;
mod combine;
pub mod data;
pub mod error;
pub mod extents;
pub mod filesystem;
mod fuse;
pub mod namespace;
pub mod observe;
pub mod persist;
pub mod store;

#[cfg(test)]
mod posix_tests;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use error::{FsError, FsResult};
pub use filesystem::{FileSystem, MAX_FILE_BYTES};
pub use namespace::Creator;
pub use observe::{FileOp, FileOpObserver};
pub use persist::{Metadata, OpenReport, PersistError, StateDir};
pub use store::{Fence, HomedClient, PageStore};

/// How often the healer thread runs the client's background work between requests.
const BACKGROUND_INTERVAL: Duration = Duration::from_millis(100);

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Let other users than the mounting one use the file system (FUSE `allow_other`; the
    /// kernel still checks permission bits). Off by default: see docs/FS.md, Security.
    pub allow_other: bool,
    /// The source name shown in /proc/mounts.
    pub source_name: String,
    /// Told of every request answered (`remem fs --metrics`); `None` costs the requests nothing.
    pub observer: Option<Arc<dyn FileOpObserver>>,
    /// Threads that receive requests from the kernel (`remem fs --threads`, at least 1):
    /// reads and writes that arrive together run as one engine batch.
    pub threads: usize,
    /// The kernel's writeback cache (`remem fs --writeback`): write(2) returns once the bytes
    /// are in the page cache, and they reach the nodes when the kernel writes them back (at the
    /// latest on fsync or close). Off: write(2) returns once they are on the nodes.
    pub writeback: bool,
}

/// A mounted file system: requests are served on threads of their own until [`Mounted::unmount`].
pub struct Mounted {
    mountpoint: PathBuf,
    session: Option<JoinHandle<std::io::Result<()>>>,
    unmounter: fuser::SessionUnmounter,
    stop: Arc<AtomicBool>,
    healer: Option<JoinHandle<()>>,
    /// Journals lazy times and fdatasyncs the journal once requests have stopped.
    sync: Box<dyn FnMut() + Send>,
}

/// Mounts `filesystem` at `mountpoint` and serves it on background threads
/// (`MountOptions::threads`).
///
/// Errors: the mount itself (no /dev/fuse, no permission, a bad mount point).
pub fn mount<S: PageStore + 'static>(
    filesystem: FileSystem<S>,
    mountpoint: &Path,
    options: &MountOptions,
) -> std::io::Result<Mounted> {
    let buffers = Arc::new(fuse::BufferPool::default());
    let served = fuse::Served::new(filesystem, options.observer.clone(), Arc::clone(&buffers));
    let inner = Arc::new(combine::Combining::new(served));
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(options.source_name.clone()),
        fuser::MountOption::Subtype("remem".to_owned()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
    ];
    config.acl = if options.allow_other { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    // Each thread reads requests from its own clone of the FUSE device (its own processing
    // queue in the kernel).
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    let fuse = fuse::Fuse::new(Arc::clone(&inner), options.observer.clone(), buffers, options.writeback);
    let mut session = fuser::Session::new(fuse, mountpoint, &config)?;
    let unmounter = session.unmount_callable();
    let session = std::thread::Builder::new().name("remem-fs".to_owned()).spawn(move || session.run())?;
    let stop = Arc::new(AtomicBool::new(false));
    let sync = {
        let inner = Arc::clone(&inner);
        Box::new(move || {
            if let Err(error) = inner.lock().sync() {
                tracing::error!(%error, "cannot sync the metadata journal at unmount");
            }
        })
    };
    let healer = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new().name("remem-fs-heal".to_owned()).spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(BACKGROUND_INTERVAL);
                // The timer's journal flush runs without the lock, as fsync's does.
                let pending = inner.lock().background();
                if let Some((journal, last_seq)) = pending {
                    match journal.sync_data() {
                        Ok(()) => inner.lock().synced(last_seq),
                        Err(error) => tracing::warn!(%error, "cannot sync the metadata journal"),
                    }
                }
            }
        })?
    };
    Ok(Mounted {
        mountpoint: mountpoint.to_path_buf(),
        session: Some(session),
        unmounter,
        stop,
        healer: Some(healer),
        sync,
    })
}

impl Mounted {
    /// Whether the request thread has ended (the file system was unmounted from outside, or
    /// the kernel connection broke).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|session| session.is_finished())
    }

    /// Detaches the mount (lazily: files still open keep working) and waits up to `grace` for
    /// the last of them to close. Returns false if some were still open: the connection ends
    /// when this process exits, and their next access fails with `ENOTCONN`; the mount point
    /// is free either way.
    pub fn unmount(mut self, grace: Duration) -> bool {
        // As root fuser unmounts with umount(2), which fails with EBUSY while a file is open:
        // left at that, the mount would outlive this process as a dead one (ENOTCONN on the
        // mount point itself). Detach it lazily then.
        if let Err(error) = self.unmounter.unmount() {
            tracing::debug!(%error, "unmount refused; detaching lazily");
            if let Err(error) = detach_lazily(&self.mountpoint) {
                tracing::warn!(%error, mountpoint = %self.mountpoint.display(), "cannot detach the mount");
            }
        }
        let deadline = Instant::now() + grace;
        let mut finished = false;
        while Instant::now() < deadline {
            if self.is_finished() {
                finished = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if finished {
            if let Some(session) = self.session.take() {
                if let Ok(Err(error)) = session.join() {
                    tracing::warn!(%error, "FUSE session ended with an error");
                }
            }
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(healer) = self.healer.take() {
            let _ = healer.join();
        }
        (self.sync)();
        finished
    }
}

/// Detaches the mount at `mountpoint` lazily (`umount2(MNT_DETACH)`, or `fusermount3 -u -z` for
/// a user's own FUSE mount when not root): the mount point is free at once, and files still
/// open on the mount keep their connection until they close.
///
/// Errors: nothing is mounted there (`EINVAL`), or neither way is permitted.
pub fn detach_lazily(mountpoint: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path; umount2 only reads it.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() != Some(libc::EPERM) {
        return Err(error);
    }
    let output = std::process::Command::new("fusermount3")
        .args(["-u", "-z", "--"])
        .arg(mountpoint)
        .stdin(std::process::Stdio::null())
        .output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "fusermount3 -u -z: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}
