//! The FUSE side: `fuser::Filesystem` over `FileSystem`, requests checked and errors mapped.
//!
//! Every value from the kernel is checked before it is used: inode numbers name a live inode
//! (else `ENOENT`), names are at most 255 bytes without `/` or NUL, offsets plus lengths stay
//! under `MAX_FILE_BYTES` (else `EFBIG`), reads and writes are at most `MAX_IO_BYTES`, mode
//! bits are masked to 07777, and nodes are files, directories, symlinks, FIFOs, devices and sockets.
//! Errors become errnos in `crate::error` only.
//!
//! Several fuser threads receive requests (`MountOptions::threads`). One lock holds the whole
//! file system (`crate::combine`): metadata requests take it and run alone; reads and writes
//! are combined. A read or write whose thread finds the lock free runs at once, with every read
//! and write queued before it, as one batch (`crate::batch`); one that finds it busy is queued,
//! its bytes copied into a pooled buffer, with its reply object, and its thread goes back to
//! the kernel for the next request: the holder runs it and replies (from its own thread). The
//! healer thread takes the lock between batches for the client's background work.
//!
//! With an observer (`crate::observe`) each answered request is reported once, after its work
//! and before its reply; without one the clock is not read.
//!
//! `served` holds the queued and batched reads and writes with their replies; `kernel` turns the
//! file system's types into the kernel's (errnos, attributes, flags).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::combine::{Combining, Guard};
use crate::error::FsError;
use crate::filesystem::SetAttributes;
use crate::namespace::{Attributes, FileKind};
use crate::observe::{FileOp, FileOpObserver};
use crate::store::PageStore;

mod kernel;
mod served;

use kernel::{creator, errno, file_attr, file_type, open_flags, time};
use served::{recycle_vec, report, Payload, Pending, Replier};
pub(crate) use served::{BufferPool, Served};

/// How long the kernel may cache attributes and names. Every change reaches the file system
/// through this kernel's requests (one host, no other writer), and the kernel updates or drops
/// what it cached of the nodes a request changes (the parent directories of a create, unlink
/// or rename, the inode of a link, unlink, setattr or write), so its cache stays true for as
/// long as it keeps it; the bound only caps how long a bug in that could show.
const TTL: Duration = Duration::from_secs(60);
/// Largest write the kernel sends us in one request.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Background requests the kernel may have outstanding (readahead, and asynchronous direct
/// I/O such as a loop device's): enough for a loop device's queue to reach us as batches.
const MAX_BACKGROUND_REQUESTS: u16 = 128;
pub struct Fuse<S: PageStore> {
    shared: Arc<Combining<Served<S>>>,
    observer: Option<Arc<dyn FileOpObserver>>,
    buffers: Arc<BufferPool>,
    /// The kernel's writeback cache is asked for (`MountOptions::writeback`).
    writeback: bool,
    /// Files whose bytes changed behind the page cache (an `O_DIRECT` write or a fallocate)
    /// since they were last opened: their next open drops the kernel's cached pages. Every
    /// other open keeps them (`FOPEN_KEEP_CACHE`), since every other change went through them.
    changed_uncached: Mutex<HashSet<u64>>,
}

impl<S: PageStore> Fuse<S> {
    pub(crate) fn new(
        shared: Arc<Combining<Served<S>>>,
        observer: Option<Arc<dyn FileOpObserver>>,
        buffers: Arc<BufferPool>,
        writeback: bool,
    ) -> Self {
        Fuse { shared, observer, buffers, writeback, changed_uncached: Mutex::new(HashSet::new()) }
    }

    /// Notes that `inode`'s bytes changed behind the page cache.
    fn changed_uncached(&self, inode: u64) {
        self.changed_uncached.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(inode);
    }

    /// The flags of an open of `inode` with `flags`: the page cache is kept unless its bytes
    /// changed behind it since the last open (then the kernel drops it, once).
    fn opened_flags(&self, inode: u64, flags: i32) -> FopenFlags {
        let changed =
            self.changed_uncached.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&inode);
        let flags = open_flags(flags);
        if changed || flags.contains(FopenFlags::FOPEN_DIRECT_IO) {
            flags
        } else {
            flags | FopenFlags::FOPEN_KEEP_CACHE
        }
    }
    /// The file system, after every read and write that came before (a panic under the lock
    /// was a bug in a request; the metadata it left is still the best there is, and refusing
    /// every later request would only add to the damage).
    fn lock(&self) -> Guard<'_, Served<S>> {
        self.shared.lock()
    }

    /// Runs a read or write now, with those queued before it, if the lock is free; queues it
    /// otherwise (its bytes copied), for the holder to run.
    fn serve(&self, pending: Pending<'_>) {
        let Some(mut guard) = self.shared.try_lock() else {
            self.shared.submit(pending.into_owned(&self.buffers));
            return;
        };
        guard.with_queued(|served, queued| {
            let mut batch: Vec<Pending<'_>> = recycle_vec(std::mem::take(&mut served.spare_batch));
            for queued in queued.drain(..) {
                batch.push(queued);
            }
            batch.push(pending);
            served.run_batch(&mut batch);
            served.spare_batch = recycle_vec(batch);
        });
    }

    /// Makes the metadata journal durable: the lock is held to journal what is pending, not
    /// during the disk's flush, so reads and writes go on meanwhile.
    /// `with_times`: fsync and fsyncdir (lazily kept mtimes too), not fdatasync.
    fn sync(&self, with_times: bool) -> std::io::Result<()> {
        let Some((journal, last_seq)) = self.lock().start_sync(with_times)? else { return Ok(()) };
        journal.sync_data()?;
        self.lock().synced(last_seq);
        Ok(())
    }

    /// When a request began, if anyone is told of it.
    fn start(&self) -> Option<Instant> {
        self.observer.as_ref().map(|_| Instant::now())
    }

    /// Reports a request begun at `started` (see [`Fuse::start`]).
    fn done(&self, op: FileOp, started: Option<Instant>, bytes: u64, failed: bool) {
        report(&self.observer, op, started, bytes, failed);
    }

    /// Replies with an entry, which the kernel holds until it forgets it (see
    /// `Namespace::remember`).
    fn reply_entry(&self, fs: &mut Served<S>, result: Result<Attributes, FsError>, reply: ReplyEntry) {
        match result.and_then(|attributes| fs.remember(attributes.inode).map(|()| attributes)) {
            Ok(attributes) => reply.entry(&TTL, &file_attr(&attributes, fs.page_bytes()), Generation(0)),
            Err(error) => reply.error(errno(&error)),
        }
    }
}

fn sync_reply(result: std::io::Result<()>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(error) => {
            tracing::error!(%error, "cannot sync the metadata journal: EIO");
            reply.error(Errno::from_i32(libc::EIO));
        }
    }
}

fn empty(result: Result<(), FsError>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(error) => reply.error(errno(&error)),
    }
}

impl<S: PageStore + 'static> fuser::Filesystem for Fuse<S> {
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Write-through by default (no FUSE_WRITEBACK_CACHE): a write(2) returns after its
        // pages are on the nodes. With the writeback cache the kernel keeps written pages and
        // sends them later, in requests of up to MAX_WRITE_BYTES, at the latest on fsync and
        // close (docs/FS.md, SEMANTICS). 1 MiB requests amortise the per-request cost.
        if self.writeback {
            if let Err(missing) = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE) {
                tracing::warn!(?missing, "the kernel lacks FUSE's writeback cache: writing through");
            }
        }
        // Lookups and readdirs of one directory may reach us together (they take the lock
        // here anyway; the kernel no longer holds the directory's lock while they wait).
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS) {
            tracing::debug!(?missing, "the kernel lacks parallel directory operations");
        }
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        let _ = config.set_max_readahead(MAX_WRITE_BYTES);
        // Asynchronous direct I/O: without it the kernel sends an O_DIRECT read or write of an
        // asynchronous caller (a loop device's, io_uring, AIO) and waits for its reply before
        // the caller may issue the next, so a loop device reaches us one request at a time.
        // With it they arrive together (up to the background limit) and are combined.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO) {
            tracing::warn!(?missing, "the kernel lacks asynchronous direct I/O for FUSE");
        }
        let _ = config.set_max_background(MAX_BACKGROUND_REQUESTS);
        Ok(())
    }

    /// The session ends (unmount): make the journal durable.
    fn destroy(&mut self) {
        if let Err(error) = self.lock().sync() {
            tracing::error!(%error, "cannot sync the metadata journal at unmount");
        }
    }

    fn lookup(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let started = self.start();
        let mut fs = self.lock();
        let result = fs.lookup(parent.0, name);
        self.done(FileOp::Lookup, started, 0, result.is_err());
        self.reply_entry(&mut fs, result, reply);
    }

    /// The kernel dropped references it held; an inode without a name or other holders goes.
    /// (fuser's default `batch_forget` calls this for each inode; its item type is private.)
    fn forget(&self, _request: &Request, inode: INodeNo, count: u64) {
        if let Err(error) = self.lock().forget(inode.0, count) {
            tracing::warn!(%error, inode = inode.0, "forget");
        }
    }

    fn getattr(&self, _request: &Request, inode: INodeNo, _handle: Option<FileHandle>, reply: ReplyAttr) {
        let started = self.start();
        let fs = self.lock();
        let result = fs.getattr(inode.0);
        self.done(FileOp::Getattr, started, 0, result.is_err());
        match result {
            Ok(attributes) => reply.attr(&TTL, &file_attr(&attributes, fs.page_bytes())),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn setattr(
        &self,
        _request: &Request,
        inode: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _handle: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let started = self.start();
        let changes = SetAttributes {
            mode: mode.map(|mode| (mode & 0o7777) as u16),
            uid,
            gid,
            size_bytes: size,
            atime: atime.map(time),
            mtime: mtime.map(time),
        };
        let mut fs = self.lock();
        let result = fs.setattr(inode.0, changes);
        self.done(FileOp::Setattr, started, 0, result.is_err());
        match result {
            Ok(attributes) => reply.attr(&TTL, &file_attr(&attributes, fs.page_bytes())),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn readlink(&self, _request: &Request, inode: INodeNo, reply: ReplyData) {
        let started = self.start();
        let fs = self.lock();
        let result = fs.readlink(inode.0);
        self.done(FileOp::Readlink, started, 0, result.is_err());
        match result {
            Ok(target) => reply.data(target.as_encoded_bytes()),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn mknod(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let started = self.start();
        let kind = match mode & libc::S_IFMT {
            0 | libc::S_IFREG => FileKind::File,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            libc::S_IFSOCK => FileKind::Socket,
            _ => {
                self.done(FileOp::Create, started, 0, true);
                reply.error(Errno::from_i32(libc::EINVAL));
                return;
            }
        };
        let creator = creator(request, mode, umask);
        let mut fs = self.lock();
        let result = match kind {
            FileKind::File => fs.create_file(parent.0, name, creator),
            special => fs.mknod(parent.0, name, creator, special, rdev),
        };
        self.done(FileOp::Create, started, 0, result.is_err());
        self.reply_entry(&mut fs, result, reply);
    }

    fn mkdir(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let started = self.start();
        let mut fs = self.lock();
        let result = fs.mkdir(parent.0, name, creator(request, mode, umask));
        self.done(FileOp::Mkdir, started, 0, result.is_err());
        self.reply_entry(&mut fs, result, reply);
    }

    fn unlink(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let started = self.start();
        let result = self.lock().unlink(parent.0, name);
        self.done(FileOp::Unlink, started, 0, result.is_err());
        empty(result, reply);
    }

    fn rmdir(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let started = self.start();
        let result = self.lock().rmdir(parent.0, name);
        self.done(FileOp::Rmdir, started, 0, result.is_err());
        empty(result, reply);
    }

    fn symlink(
        &self,
        request: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let started = self.start();
        let mut fs = self.lock();
        let result = fs.symlink(parent.0, link_name, target.as_os_str(), creator(request, 0o777, 0));
        self.done(FileOp::Symlink, started, 0, result.is_err());
        self.reply_entry(&mut fs, result, reply);
    }

    fn rename(
        &self,
        _request: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let started = self.start();
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        if flags.contains(RenameFlags::RENAME_WHITEOUT)
            || !RenameFlags::all().contains(flags)
            || (no_replace && exchange)
        {
            self.done(FileOp::Rename, started, 0, true);
            reply.error(Errno::from_i32(libc::EINVAL));
            return;
        }
        let result = self.lock().rename(parent.0, name, new_parent.0, new_name, no_replace, exchange);
        self.done(FileOp::Rename, started, 0, result.is_err());
        empty(result, reply);
    }

    fn link(
        &self,
        _request: &Request,
        inode: INodeNo,
        new_parent: INodeNo,
        new_name: &OsStr,
        reply: ReplyEntry,
    ) {
        let started = self.start();
        let mut fs = self.lock();
        let result = fs.link(inode.0, new_parent.0, new_name);
        self.done(FileOp::Link, started, 0, result.is_err());
        self.reply_entry(&mut fs, result, reply);
    }

    fn open(&self, _request: &Request, inode: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let started = self.start();
        let opened = self.lock().open(inode.0);
        match opened {
            Ok(FileKind::File) => {
                self.done(FileOp::Open, started, 0, false);
                reply.opened(FileHandle(inode.0), self.opened_flags(inode.0, flags.0))
            }
            Ok(_) => {
                // Not a regular file: undo the handle count.
                let _ = self.lock().release(inode.0);
                self.done(FileOp::Open, started, 0, true);
                reply.error(Errno::from_i32(libc::EISDIR));
            }
            Err(error) => {
                self.done(FileOp::Open, started, 0, true);
                reply.error(errno(&error))
            }
        }
    }

    fn read(
        &self,
        _request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let started = self.start();
        let reply = Some(Replier::Data(reply));
        self.serve(Pending { inode: inode.0, offset, payload: None, size: size as usize, reply, started });
    }

    fn write(
        &self,
        _request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let started = self.start();
        if flags.0 & libc::O_DIRECT != 0 {
            self.changed_uncached(inode.0);
        }
        let reply = Some(Replier::Write(reply));
        let payload = Some(Payload::Borrowed(data));
        self.serve(Pending { inode: inode.0, offset, payload, size: data.len(), reply, started });
    }

    /// Nothing to do at close: ENOSYS makes the kernel stop sending FLUSH, one round trip
    /// less per close(2). (With the writeback cache the kernel still writes a file's dirty
    /// pages back at close, before it would send FLUSH, and close(2) reports their errors.)
    fn flush(
        &self,
        _request: &Request,
        _inode: INodeNo,
        _handle: FileHandle,
        _owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn release(
        &self,
        _request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let started = self.start();
        let result = self.lock().release(inode.0);
        self.done(FileOp::Release, started, 0, result.is_err());
        empty(result, reply);
    }

    /// Data is on the nodes when a write reaches us (docs/FS.md, SEMANTICS; with the writeback
    /// cache the kernel sends a file's dirty pages before its fsync); what fsync adds is the
    /// metadata journal on local disk (fdatasync), so a host crash keeps it too; fdatasync
    /// leaves the lazily kept mtimes to the timer (they are not needed to read the data).
    fn fsync(
        &self,
        _request: &Request,
        _inode: INodeNo,
        _handle: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let started = self.start();
        let result = self.sync(!datasync);
        self.done(FileOp::Fsync, started, 0, result.is_err());
        sync_reply(result, reply);
    }

    fn readdir(
        &self,
        _request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let started = self.start();
        let fs = self.lock();
        let result = fs.readdir(inode.0, offset, |entry, cookie, kind, name| {
            reply.add(INodeNo(entry), cookie, file_type(kind), name)
        });
        self.done(FileOp::Readdir, started, 0, result.is_err());
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn fsyncdir(
        &self,
        _request: &Request,
        _inode: INodeNo,
        _handle: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let started = self.start();
        let result = self.sync(true);
        self.done(FileOp::Fsync, started, 0, result.is_err());
        sync_reply(result, reply);
    }

    fn statfs(&self, _request: &Request, _inode: INodeNo, reply: ReplyStatfs) {
        let started = self.start();
        let fs = self.lock();
        let usage = fs.usage();
        self.done(FileOp::Statfs, started, 0, false);
        let page_bytes = fs.page_bytes() as u32;
        let free_inodes = u64::from(u32::MAX).saturating_sub(usage.inodes);
        reply.statfs(
            usage.total_pages,
            usage.free_pages,
            usage.free_pages,
            usage.inodes + free_inodes,
            free_inodes,
            page_bytes,
            crate::namespace::MAX_NAME_BYTES as u32,
            page_bytes,
        );
    }

    /// Permissions are checked by the kernel (`default_permissions`).
    fn access(&self, _request: &Request, inode: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let started = self.start();
        let result = self.lock().getattr(inode.0).map(|_| ());
        self.done(FileOp::Access, started, 0, result.is_err());
        empty(result, reply);
    }

    fn create(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let started = self.start();
        if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
            self.done(FileOp::Create, started, 0, true);
            reply.error(Errno::from_i32(libc::EPERM));
            return;
        }
        let mut fs = self.lock();
        let created = fs.create_file(parent.0, name, creator(request, mode, umask));
        let result = created.and_then(|attributes| {
            fs.open(attributes.inode)?;
            fs.remember(attributes.inode)?;
            Ok(attributes)
        });
        self.done(FileOp::Create, started, 0, result.is_err());
        match result {
            Ok(attributes) => reply.created(
                &TTL,
                &file_attr(&attributes, fs.page_bytes()),
                Generation(0),
                FileHandle(attributes.inode),
                self.opened_flags(attributes.inode, flags),
            ),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn fallocate(
        &self,
        _request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let started = self.start();
        self.changed_uncached(inode.0);
        let result = self.lock().fallocate(inode.0, offset, length, mode);
        self.done(FileOp::Fallocate, started, 0, result.is_err());
        empty(result, reply);
    }

    // No extended attributes. ENOSYS (not ENOTSUP) makes the kernel stop asking for good;
    // otherwise every write would first ask for `security.capability`.
    fn getxattr(
        &self,
        _request: &Request,
        _inode: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn listxattr(&self, _request: &Request, _inode: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn setxattr(
        &self,
        _request: &Request,
        _inode: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn removexattr(&self, _request: &Request, _inode: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }
}
