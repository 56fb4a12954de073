//! `FileSystem`: the namespace, the page allocator and the page store together, with the
//! operations the FUSE layer calls (already validated there). No FUSE types here, so the whole
//! file system is tested against a `HashMap` page store.
//!
//! Every metadata change is described by `persist::record::Record`s, queued in `pending` while
//! the operation runs and appended to the journal (when there is one) before the operation
//! returns, on failure too: an operation that failed half way may have changed metadata (pages
//! mapped before a remem write failed), and the journal must say so. An append that fails
//! fails the operation (`EIO`).

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::time::SystemTime;

use remem_client::PageOp;

use crate::error::{FsError, FsResult};
use crate::extents::{Allocator, ExtentMap, RunSet};
use crate::namespace::{
    Attributes, Content, Creator, Directory, FileKind, Inode, Namespace, MAX_SYMLINK_BYTES,
};
use crate::persist::record::Record;
use crate::persist::Appended;
use crate::persist::Journal;
use crate::store::PageStore;

/// Largest file size: 2^50 bytes (1 PiB) of logical size; pages are allocated only when written.
pub const MAX_FILE_BYTES: u64 = 1 << 50;
/// Largest read or write the kernel may send (the FUSE maximum is 16 MiB; we ask for 1 MiB).
pub const MAX_IO_BYTES: usize = 16 << 20;

/// The set-group-ID bit of a mode.
pub const SET_GROUP_ID: u16 = 0o2000;
/// The set-user-ID bit of a mode.
pub const SET_USER_ID: u16 = 0o4000;

/// Attribute changes of `setattr`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttributes {
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size_bytes: Option<u64>,
    pub atime: Option<SystemTime>,
    pub mtime: Option<SystemTime>,
}

/// What `statfs` reports.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub total_pages: u64,
    pub free_pages: u64,
    pub inodes: u64,
}

pub struct FileSystem<S: PageStore> {
    pub(crate) store: S,
    pub(crate) namespace: Namespace,
    pub(crate) allocator: Allocator,
    pub(crate) page_bytes: usize,
    /// Read replies are built here; grows to the largest batch of reads seen, then stays.
    pub(crate) arena: Vec<u8>,
    /// The two partial pages of each write of a batch (read-modify-write); at least two.
    pub(crate) scratch: Vec<u8>,
    /// The allocation of the op list, kept between requests (see `recycle`).
    pub(crate) spare_ops: Vec<PageOp<'static>>,
    /// The plans and op owners of the batch path, kept between requests.
    pub(crate) batch: crate::batch::BatchBuffers,
    /// Remem pages mapped to a file and never written since (fallocated): they read as zeros
    /// because they were discarded, which a restarted client would not know, so they are
    /// saved and discarded again at the next start.
    pub(crate) unwritten: RunSet,
    /// Inodes whose times changed without a record (overwrites): journaled on sync.
    pub(crate) dirty_times: BTreeSet<u64>,
    /// Records of the operation running now (see the module docs).
    pub(crate) pending: Vec<Record>,
    pub(crate) journal: Option<Journal>,
}

/// Reuses a `Vec`'s allocation for a list of another lifetime: an empty `Vec` collected from an
/// empty iterator over it keeps its buffer (in-place collection, same size and alignment).
pub(crate) fn recycle<'a, 'b>(mut ops: Vec<PageOp<'a>>) -> Vec<PageOp<'b>> {
    ops.clear();
    ops.into_iter().map(|_| unreachable!("cleared")).collect()
}

impl<S: PageStore> FileSystem<S> {
    /// A file system with an empty root directory owned by `owner`, its files in the pages of
    /// `store`.
    pub fn new(store: S, owner: Creator) -> FileSystem<S> {
        let page_bytes = store.page_bytes();
        assert!(page_bytes.is_power_of_two() && page_bytes >= 512, "page size {page_bytes}");
        FileSystem {
            allocator: Allocator::new(store.page_count()),
            namespace: Namespace::new(owner, SystemTime::now()),
            page_bytes,
            arena: Vec::new(),
            scratch: vec![0; 2 * page_bytes],
            spare_ops: Vec::with_capacity(256),
            batch: crate::batch::BatchBuffers::default(),
            unwritten: RunSet::default(),
            dirty_times: BTreeSet::new(),
            pending: Vec::new(),
            journal: None,
            store,
        }
    }

    /// Appends the pending records to the journal (dropped when there is none), then returns
    /// `result`; a failed append is the operation's error.
    pub(crate) fn commit<T>(&mut self, result: FsResult<T>) -> FsResult<T> {
        if self.pending.is_empty() {
            return result;
        }
        let appended = match &mut self.journal {
            Some(journal) => journal.append(&self.pending),
            None => Ok(Appended::Written),
        };
        self.pending.clear();
        let failure = match appended {
            Ok(Appended::Written) => return result,
            // The records are numbered and memory holds them: a snapshot includes them.
            Ok(Appended::NoRoom) => match self.compact() {
                Ok(()) => return result,
                Err(error) => {
                    if let Some(journal) = &mut self.journal {
                        journal.fail();
                    }
                    error.to_string()
                }
            },
            // The journal decided whether it can go on (a remote one keeps the records).
            Err(error) => error.to_string(),
        };
        tracing::error!(error = %failure, "cannot append to the metadata journal");
        Err(FsError::Journal(failure))
    }

    /// Journals the times kept lazily (see `dirty_times`).
    pub(crate) fn flush_times(&mut self) -> FsResult<()> {
        let dirty = std::mem::take(&mut self.dirty_times);
        for inode in dirty {
            if let Ok(entry) = self.namespace.get(inode) {
                let attributes = &entry.attributes;
                self.pending.push(Record::Times {
                    inode,
                    atime: attributes.atime,
                    mtime: attributes.mtime,
                    ctime: attributes.ctime,
                });
            }
        }
        self.commit(Ok(()))
    }

    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    pub fn getattr(&self, inode: u64) -> FsResult<Attributes> {
        Ok(self.namespace.get(inode)?.attributes)
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Attributes> {
        let inode = self.namespace.lookup(parent, name)?;
        self.getattr(inode)
    }

    /// Creates a node and journals it. In a set-group-ID directory the node takes the
    /// directory's group, and a subdirectory the set-group-ID bit too (as ext4 and tmpfs do;
    /// whether a non-directory keeps its own set-group-ID bit the kernel has decided already).
    fn create_node(
        &mut self,
        parent: u64,
        name: &OsStr,
        mut creator: Creator,
        content: Content,
    ) -> FsResult<Attributes> {
        let now = SystemTime::now();
        let parent_attributes = self.getattr(parent)?;
        if parent_attributes.mode & SET_GROUP_ID != 0 {
            creator.gid = parent_attributes.gid;
            if matches!(content, Content::Directory(_)) {
                creator.mode |= SET_GROUP_ID;
            }
        }
        let (kind, target, rdev) = match &content {
            Content::Symlink(target) => (FileKind::Symlink, Some(target.clone()), 0),
            Content::Special { kind, rdev } => (*kind, None, *rdev),
            other => (other.kind(), None, 0),
        };
        let inode = self.namespace.create(parent, name, creator, content, now)?;
        let attributes = self.getattr(inode)?;
        self.pending.push(Record::Create {
            parent,
            name: name.to_owned(),
            inode,
            kind,
            mode: attributes.mode,
            uid: attributes.uid,
            gid: attributes.gid,
            time: now,
            target,
            rdev,
        });
        self.commit(Ok(attributes))
    }

    /// Creates a FIFO, device or socket: metadata only (`kind.is_special()`).
    pub fn mknod(
        &mut self,
        parent: u64,
        name: &OsStr,
        creator: Creator,
        kind: FileKind,
        rdev: u32,
    ) -> FsResult<Attributes> {
        if !kind.is_special() {
            return Err(FsError::Invalid("mknod of a kind that is not special"));
        }
        let rdev = if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) { rdev } else { 0 };
        self.create_node(parent, name, creator, Content::Special { kind, rdev })
    }

    pub fn create_file(&mut self, parent: u64, name: &OsStr, creator: Creator) -> FsResult<Attributes> {
        self.create_node(parent, name, creator, Content::File(ExtentMap::default()))
    }

    pub fn mkdir(&mut self, parent: u64, name: &OsStr, creator: Creator) -> FsResult<Attributes> {
        self.create_node(parent, name, creator, Content::Directory(Directory::default()))
    }

    pub fn symlink(
        &mut self,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
        creator: Creator,
    ) -> FsResult<Attributes> {
        if target.len() > MAX_SYMLINK_BYTES || target.is_empty() {
            return Err(FsError::Invalid("symbolic link target length"));
        }
        let creator = Creator { mode: 0o777, ..creator };
        self.create_node(parent, name, creator, Content::Symlink(target.to_owned()))
    }

    pub fn readlink(&self, inode: u64) -> FsResult<&OsStr> {
        match &self.namespace.get(inode)?.content {
            Content::Symlink(target) => Ok(target),
            _ => Err(FsError::Invalid("not a symbolic link")),
        }
    }

    pub fn link(&mut self, inode: u64, parent: u64, name: &OsStr) -> FsResult<Attributes> {
        let now = SystemTime::now();
        self.namespace.link(inode, parent, name, now)?;
        self.pending.push(Record::Link { inode, parent, name: name.to_owned(), time: now });
        let attributes = self.getattr(inode);
        self.commit(attributes)
    }

    pub fn unlink(&mut self, parent: u64, name: &OsStr) -> FsResult<()> {
        let now = SystemTime::now();
        let gone = self.namespace.unlink(parent, name, now)?;
        self.pending.push(Record::Unlink { parent, name: name.to_owned(), time: now });
        let result = self.free_inode(gone);
        self.commit(result)
    }

    pub fn rmdir(&mut self, parent: u64, name: &OsStr) -> FsResult<()> {
        let now = SystemTime::now();
        let gone = self.namespace.rmdir(parent, name, now)?;
        self.pending.push(Record::Rmdir { parent, name: name.to_owned(), time: now });
        let result = self.free_inode(gone);
        self.commit(result)
    }

    pub fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        no_replace: bool,
        exchange: bool,
    ) -> FsResult<()> {
        let now = SystemTime::now();
        let gone = self.namespace.rename(parent, name, new_parent, new_name, no_replace, exchange, now)?;
        self.pending.push(Record::Rename {
            parent,
            name: name.to_owned(),
            new_parent,
            new_name: new_name.to_owned(),
            no_replace,
            exchange,
            time: now,
        });
        let result = self.free_inode(gone);
        self.commit(result)
    }

    pub fn open(&mut self, inode: u64) -> FsResult<FileKind> {
        self.namespace.open(inode)?;
        Ok(self.namespace.get(inode)?.attributes.kind)
    }

    pub fn release(&mut self, inode: u64) -> FsResult<()> {
        let gone = self.namespace.release(inode);
        let result = self.free_inode(gone);
        self.commit(result)
    }

    /// The kernel was given an entry for `inode`: it holds the inode until it forgets it.
    pub fn remember(&mut self, inode: u64) -> FsResult<()> {
        self.namespace.remember(inode)
    }

    /// The kernel dropped `count` references to `inode`; an inode without a name and without
    /// other holders is freed.
    pub fn forget(&mut self, inode: u64, count: u64) -> FsResult<()> {
        let gone = self.namespace.forget(inode, count);
        let result = self.free_inode(gone);
        self.commit(result)
    }

    /// Returns the pages of an inode that is gone for good to the allocator, discarded in remem
    /// first so that whoever gets them next reads zeros; journals that it is gone.
    fn free_inode(&mut self, gone: Option<Inode>) -> FsResult<()> {
        let Some(gone) = gone else { return Ok(()) };
        self.pending.push(Record::Release { inode: gone.attributes.inode });
        self.dirty_times.remove(&gone.attributes.inode);
        let Inode { content: Content::File(mut extents), .. } = gone else { return Ok(()) };
        let mut runs = Vec::new();
        extents.clear(|remote, len| runs.push((remote, len)));
        self.release_runs(&runs)
    }

    /// Discards and frees remem runs. A discard fails only for a page outside the address
    /// space, which the allocator never hands out.
    pub(crate) fn release_runs(&mut self, runs: &[(u64, u64)]) -> FsResult<()> {
        for &(remote, len) in runs {
            for page in remote..remote + len {
                self.store.discard_page(page)?;
            }
            self.unwritten.remove(remote, len);
            self.allocator.release(remote, len);
        }
        Ok(())
    }

    pub fn setattr(&mut self, inode: u64, changes: SetAttributes) -> FsResult<Attributes> {
        if let Some(size_bytes) = changes.size_bytes {
            self.truncate(inode, size_bytes)?;
        }
        let entry = self.namespace.get_mut(inode)?;
        let now = SystemTime::now();
        self.pending.push(Record::SetAttributes {
            inode,
            mode: changes.mode.map(|mode| mode & 0o7777),
            uid: changes.uid,
            gid: changes.gid,
            atime: changes.atime,
            mtime: changes.mtime,
            ctime: now,
        });
        let attributes = &mut entry.attributes;
        if let Some(mode) = changes.mode {
            attributes.mode = mode & 0o7777;
        }
        if let Some(uid) = changes.uid {
            attributes.uid = uid;
        }
        if let Some(gid) = changes.gid {
            attributes.gid = gid;
        }
        if let Some(atime) = changes.atime {
            attributes.atime = atime;
        }
        if let Some(mtime) = changes.mtime {
            attributes.mtime = mtime;
        }
        attributes.ctime = now;
        let attributes = *attributes;
        self.commit(Ok(attributes))
    }

    /// Calls `add(inode, cookie, kind, name)` for the entries after `cookie` ("." is cookie 1,
    /// ".." cookie 2) until it returns true (the reply is full).
    pub fn readdir(
        &self,
        inode: u64,
        cookie: u64,
        mut add: impl FnMut(u64, u64, FileKind, &OsStr) -> bool,
    ) -> FsResult<()> {
        let directory = self.namespace.directory(inode)?;
        if cookie < 1 && add(inode, 1, FileKind::Directory, OsStr::new(".")) {
            return Ok(());
        }
        if cookie < 2 && add(directory.parent, 2, FileKind::Directory, OsStr::new("..")) {
            return Ok(());
        }
        for (entry_cookie, name, entry) in directory.after(cookie.max(2)) {
            let kind = self.namespace.get(entry)?.attributes.kind;
            if add(entry, entry_cookie, kind, name) {
                break;
            }
        }
        Ok(())
    }

    pub fn usage(&self) -> Usage {
        Usage {
            total_pages: self.allocator.total_pages(),
            free_pages: self.allocator.free_pages(),
            inodes: self.namespace.inode_count(),
        }
    }

    /// Background work between requests: the page store's healing, then the journal's
    /// compaction; returns the journal to fdatasync without the lock when its periodic sync is
    /// due (see `FileSystem::maintain`).
    pub fn background(&mut self) -> Option<(std::fs::File, u64)> {
        self.store.background();
        self.maintain()
    }
}
