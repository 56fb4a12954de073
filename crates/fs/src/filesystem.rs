//! `FileSystem`: the namespace, the page allocator and the page store together, with the
//! operations the FUSE layer calls (already validated there). No FUSE types here, so the whole
//! file system is tested against a `HashMap` page store.

use std::ffi::OsStr;
use std::time::SystemTime;

use remem_client::PageOp;

use crate::error::{FsError, FsResult};
use crate::extents::{Allocator, ExtentMap};
use crate::namespace::{
    Attributes, Content, Creator, Directory, FileKind, Inode, Namespace, MAX_SYMLINK_BYTES,
};
use crate::store::PageStore;

/// Largest file size: 2^50 bytes (1 PiB) of logical size; pages are allocated only when written.
pub const MAX_FILE_BYTES: u64 = 1 << 50;
/// Largest read or write the kernel may send (the FUSE maximum is 16 MiB; we ask for 1 MiB).
pub const MAX_IO_BYTES: usize = 16 << 20;

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
    /// Read replies are built here; grows to the largest read seen, then stays.
    pub(crate) arena: Vec<u8>,
    /// The two partial pages of a write (read-modify-write).
    pub(crate) scratch: Vec<u8>,
    /// The allocation of the op list, kept between requests (see `recycle`).
    pub(crate) spare_ops: Vec<PageOp<'static>>,
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
            namespace: Namespace::new(owner),
            page_bytes,
            arena: Vec::new(),
            scratch: vec![0; 2 * page_bytes],
            spare_ops: Vec::with_capacity(256),
            store,
        }
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

    pub fn create_file(&mut self, parent: u64, name: &OsStr, creator: Creator) -> FsResult<Attributes> {
        let inode = self.namespace.create(parent, name, creator, Content::File(ExtentMap::default()))?;
        self.getattr(inode)
    }

    pub fn mkdir(&mut self, parent: u64, name: &OsStr, creator: Creator) -> FsResult<Attributes> {
        let inode = self.namespace.create(parent, name, creator, Content::Directory(Directory::default()))?;
        self.getattr(inode)
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
        let inode = self.namespace.create(parent, name, creator, Content::Symlink(target.to_owned()))?;
        self.getattr(inode)
    }

    pub fn readlink(&self, inode: u64) -> FsResult<&OsStr> {
        match &self.namespace.get(inode)?.content {
            Content::Symlink(target) => Ok(target),
            _ => Err(FsError::Invalid("not a symbolic link")),
        }
    }

    pub fn link(&mut self, inode: u64, parent: u64, name: &OsStr) -> FsResult<Attributes> {
        self.namespace.link(inode, parent, name)?;
        self.getattr(inode)
    }

    pub fn unlink(&mut self, parent: u64, name: &OsStr) -> FsResult<()> {
        let gone = self.namespace.unlink(parent, name)?;
        self.free_inode(gone)
    }

    pub fn rmdir(&mut self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.namespace.rmdir(parent, name)
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
        let gone = self.namespace.rename(parent, name, new_parent, new_name, no_replace, exchange)?;
        self.free_inode(gone)
    }

    pub fn open(&mut self, inode: u64) -> FsResult<FileKind> {
        self.namespace.open(inode)?;
        Ok(self.namespace.get(inode)?.attributes.kind)
    }

    pub fn release(&mut self, inode: u64) -> FsResult<()> {
        let gone = self.namespace.release(inode);
        self.free_inode(gone)
    }

    /// Returns the pages of an inode that is gone for good to the allocator, discarded in remem
    /// first so that whoever gets them next reads zeros.
    fn free_inode(&mut self, gone: Option<Inode>) -> FsResult<()> {
        let Some(Inode { content: Content::File(mut extents), .. }) = gone else { return Ok(()) };
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
        Ok(*attributes)
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

    /// Background work of the page store (healing between requests).
    pub fn background(&mut self) {
        self.store.background();
    }
}
