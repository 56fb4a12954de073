//! The metadata of the file system: inodes, their attributes, directories and names.
//!
//! It lives in the memory of the `remem fs` process; `crate::persist` journals every change and
//! snapshots the whole of it, so a restart finds it again (docs/FS.md). Nothing here does I/O
//! and nothing reads the clock: every change is given its time, so that replaying a journal
//! rebuilds exactly what the live process had. A file's pages are only named here (its
//! `ExtentMap`), and an inode whose last name and last open handle are gone is handed back to
//! the caller, which frees its pages.
//!
//! Invariants: every directory entry names a live inode; a directory's `parent` names the
//! directory that holds its one entry (the root is its own parent); `nlink` of a file is the
//! number of entries that name it, of a directory 2 + its subdirectories (0 once removed); no
//! directory is its own ancestor.
//!
//! Lifetimes: an inode lives while it has a name, an open handle or a reference of the
//! kernel's (`lookups`: every entry the kernel was given, less what it forgot). The kernel
//! caches names and inodes and may send a request for an inode it looked up before a rename
//! or unlink removed its last name (an `open` racing a `rename` over the file): that inode
//! must still be there. An inode without a name that is still held is an orphan; it goes with
//! the last of its holders. Lookups are not persisted: after a restart the kernel holds
//! nothing, so every orphan is freed.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

use crate::error::{FsError, FsResult};
use crate::extents::ExtentMap;

pub const ROOT_INODE: u64 = 1;
/// The longest name a directory takes (Linux's NAME_MAX).
pub const MAX_NAME_BYTES: usize = 255;
/// The longest symbolic link target (Linux's PATH_MAX).
pub const MAX_SYMLINK_BYTES: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    /// Special files: metadata only (mode, owner, times, `rdev`), no pages. The kernel serves
    /// their opens itself (pipes, devices, sockets); the file system only names them.
    Fifo,
    CharDevice,
    BlockDevice,
    Socket,
}

impl FileKind {
    pub fn is_special(self) -> bool {
        matches!(self, FileKind::Fifo | FileKind::CharDevice | FileKind::BlockDevice | FileKind::Socket)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Attributes {
    pub inode: u64,
    pub kind: FileKind,
    pub size_bytes: u64,
    /// Pages that hold remem pages (for `st_blocks`).
    pub mapped_pages: u64,
    /// Permission bits (07777).
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// The device of a character or block device (the kernel's encoding); 0 otherwise.
    pub rdev: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
}

pub enum Content {
    File(ExtentMap),
    Directory(Directory),
    Symlink(OsString),
    /// A FIFO, device or socket (`kind.is_special()`) and its device number.
    Special {
        kind: FileKind,
        rdev: u32,
    },
}

impl Content {
    pub fn kind(&self) -> FileKind {
        match self {
            Content::File(_) => FileKind::File,
            Content::Directory(_) => FileKind::Directory,
            Content::Symlink(_) => FileKind::Symlink,
            Content::Special { kind, .. } => *kind,
        }
    }
}

pub struct Inode {
    pub attributes: Attributes,
    pub content: Content,
    pub open_handles: u32,
    /// References the kernel holds (entries replied, less forgotten); never persisted.
    pub lookups: u64,
}

impl Inode {
    /// Whether something other than a name still holds the inode.
    fn held(&self) -> bool {
        self.open_handles > 0 || self.lookups > 0
    }
}

/// A directory: names in order, each with a stable cookie so that `readdir` can resume after
/// entries were added or removed between two calls.
#[derive(Default)]
pub struct Directory {
    pub parent: u64,
    entries: BTreeMap<OsString, (u64, u64)>,
    by_cookie: BTreeMap<u64, OsString>,
    next_cookie: u64,
}

impl Directory {
    pub(crate) fn new(parent: u64) -> Directory {
        // Cookies 1 and 2 are "." and "..".
        Directory { parent, entries: BTreeMap::new(), by_cookie: BTreeMap::new(), next_cookie: 3 }
    }

    pub fn get(&self, name: &OsStr) -> Option<u64> {
        self.entries.get(name).map(|&(inode, _)| inode)
    }

    /// Every entry in name order: (name, inode).
    pub fn entries(&self) -> impl Iterator<Item = (&OsStr, u64)> + '_ {
        self.entries.iter().map(|(name, &(inode, _))| (name.as_os_str(), inode))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn insert(&mut self, name: &OsStr, inode: u64) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        if let Some((_, old_cookie)) = self.entries.insert(name.to_owned(), (inode, cookie)) {
            self.by_cookie.remove(&old_cookie);
        }
        self.by_cookie.insert(cookie, name.to_owned());
    }

    fn remove(&mut self, name: &OsStr) -> Option<u64> {
        let (inode, cookie) = self.entries.remove(name)?;
        self.by_cookie.remove(&cookie);
        Some(inode)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries after `cookie`, in cookie order: (cookie, name, inode).
    pub fn after(&self, cookie: u64) -> impl Iterator<Item = (u64, &OsStr, u64)> + '_ {
        self.by_cookie
            .range(cookie.saturating_add(1)..)
            .map(move |(&cookie, name)| (cookie, name.as_os_str(), self.entries[name].0))
    }
}

/// Every inode of the file system.
pub struct Namespace {
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
    /// While a journal is replayed: an inode whose last name goes stays (an orphan) until its
    /// `Release` record, because the live process still had it open and may have written to it.
    pub(crate) keep_orphans: bool,
}

/// Who creates a node, and with which permission bits (umask applied).
#[derive(Clone, Copy, Debug)]
pub struct Creator {
    pub uid: u32,
    pub gid: u32,
    pub mode: u16,
}

pub(crate) fn check_name(name: &OsStr) -> FsResult<()> {
    let bytes = name.as_encoded_bytes();
    if bytes.len() > MAX_NAME_BYTES {
        return Err(FsError::NameTooLong { max: MAX_NAME_BYTES });
    }
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') || bytes.contains(&0) {
        return Err(FsError::Invalid("bad file name"));
    }
    Ok(())
}

impl Namespace {
    /// A namespace with only the root directory, owned by `root_owner`.
    pub fn new(root_owner: Creator, now: SystemTime) -> Namespace {
        let mut namespace = Namespace { inodes: HashMap::new(), next_inode: ROOT_INODE, keep_orphans: false };
        let root = namespace.new_inode(
            FileKind::Directory,
            root_owner,
            Content::Directory(Directory::new(ROOT_INODE)),
            now,
        );
        assert_eq!(root, ROOT_INODE);
        namespace.get_mut(root).expect("root").attributes.nlink = 2;
        namespace
    }

    /// A namespace of inodes read back from a snapshot (already checked by the caller; see
    /// `crate::persist::snapshot`).
    pub(crate) fn from_parts(inodes: HashMap<u64, Inode>, next_inode: u64) -> Namespace {
        Namespace { inodes, next_inode, keep_orphans: false }
    }

    /// The inode number the next created node gets.
    pub fn next_inode(&self) -> u64 {
        self.next_inode
    }

    /// Every inode, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Inode)> + '_ {
        self.inodes.iter().map(|(&number, inode)| (number, inode))
    }

    /// Removes and returns the inodes without a name that nothing holds open (after a replay:
    /// the files the dead process still had open when it died).
    pub(crate) fn take_orphans(&mut self) -> Vec<Inode> {
        let orphans: Vec<u64> = self
            .inodes
            .iter()
            .filter(|(_, entry)| entry.attributes.nlink == 0 && !entry.held())
            .map(|(&number, _)| number)
            .collect();
        orphans.into_iter().filter_map(|number| self.inodes.remove(&number)).collect()
    }

    /// Removes an orphan (no name left) when the journal says its last holder let go.
    pub(crate) fn remove_orphan(&mut self, inode: u64) -> Option<Inode> {
        if self.inodes.get(&inode)?.attributes.nlink != 0 {
            return None;
        }
        self.inodes.remove(&inode)
    }

    fn new_inode(&mut self, kind: FileKind, creator: Creator, content: Content, now: SystemTime) -> u64 {
        let inode = self.next_inode;
        self.next_inode += 1;
        let attributes = Attributes {
            inode,
            kind,
            size_bytes: 0,
            mapped_pages: 0,
            mode: creator.mode & 0o7777,
            uid: creator.uid,
            gid: creator.gid,
            nlink: 1,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
        };
        self.inodes.insert(inode, Inode { attributes, content, open_handles: 0, lookups: 0 });
        inode
    }

    pub fn get(&self, inode: u64) -> FsResult<&Inode> {
        self.inodes.get(&inode).ok_or(FsError::NotFound)
    }

    pub fn get_mut(&mut self, inode: u64) -> FsResult<&mut Inode> {
        self.inodes.get_mut(&inode).ok_or(FsError::NotFound)
    }

    pub fn inode_count(&self) -> u64 {
        self.inodes.len() as u64
    }

    pub fn directory(&self, inode: u64) -> FsResult<&Directory> {
        match &self.get(inode)?.content {
            Content::Directory(directory) => Ok(directory),
            _ => Err(FsError::NotDirectory),
        }
    }

    fn directory_mut(&mut self, inode: u64) -> FsResult<&mut Directory> {
        match &mut self.get_mut(inode)?.content {
            Content::Directory(directory) => Ok(directory),
            _ => Err(FsError::NotDirectory),
        }
    }

    /// A directory that still has a name (entries cannot be added to a removed one).
    fn live_directory(&self, inode: u64) -> FsResult<&Directory> {
        let directory = self.directory(inode)?;
        if self.get(inode)?.attributes.nlink == 0 {
            return Err(FsError::NotFound);
        }
        Ok(directory)
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<u64> {
        if name.as_encoded_bytes().len() > MAX_NAME_BYTES {
            return Err(FsError::NameTooLong { max: MAX_NAME_BYTES });
        }
        self.directory(parent)?.get(name).ok_or(FsError::NotFound)
    }

    fn touch_directory(&mut self, inode: u64, now: SystemTime) {
        if let Ok(entry) = self.get_mut(inode) {
            entry.attributes.mtime = now;
            entry.attributes.ctime = now;
        }
    }

    /// Creates a node of any kind named `name` in `parent`.
    pub fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        creator: Creator,
        content: Content,
        now: SystemTime,
    ) -> FsResult<u64> {
        check_name(name)?;
        if self.live_directory(parent)?.get(name).is_some() {
            return Err(FsError::Exists);
        }
        let kind = content.kind();
        if kind.is_special() != matches!(content, Content::Special { .. }) {
            return Err(FsError::Invalid("special content of a kind that is not special"));
        }
        let content = match content {
            Content::Directory(_) => Content::Directory(Directory::new(parent)),
            other => other,
        };
        let inode = self.new_inode(kind, creator, content, now);
        let entry = self.get_mut(inode)?;
        match &entry.content {
            Content::Symlink(target) => entry.attributes.size_bytes = target.len() as u64,
            Content::Special { rdev, .. } => entry.attributes.rdev = *rdev,
            _ => {}
        }
        if kind == FileKind::Directory {
            self.get_mut(inode)?.attributes.nlink = 2;
            self.get_mut(parent)?.attributes.nlink += 1;
        }
        self.directory_mut(parent)?.insert(name, inode);
        self.touch_directory(parent, now);
        Ok(inode)
    }

    /// A second name for a file (hard link).
    pub fn link(&mut self, inode: u64, parent: u64, name: &OsStr, now: SystemTime) -> FsResult<()> {
        check_name(name)?;
        if self.get(inode)?.attributes.kind == FileKind::Directory {
            return Err(FsError::Unsupported("hard links to directories"));
        }
        if self.live_directory(parent)?.get(name).is_some() {
            return Err(FsError::Exists);
        }
        if self.get(inode)?.attributes.nlink == 0 {
            // linkat of an open unlinked file is refused by the kernel (ENOENT) before it asks.
            return Err(FsError::NotFound);
        }
        self.directory_mut(parent)?.insert(name, inode);
        let entry = self.get_mut(inode)?;
        entry.attributes.nlink += 1;
        entry.attributes.ctime = now;
        self.touch_directory(parent, now);
        Ok(())
    }

    /// Removes the name of a non-directory. Returns the inode if it is now gone for good (no
    /// name, no open handle): the caller frees its pages.
    pub fn unlink(&mut self, parent: u64, name: &OsStr, now: SystemTime) -> FsResult<Option<Inode>> {
        let inode = self.lookup(parent, name)?;
        if self.get(inode)?.attributes.kind == FileKind::Directory {
            return Err(FsError::IsDirectory);
        }
        self.directory_mut(parent)?.remove(name);
        self.touch_directory(parent, now);
        Ok(self.drop_link(inode, now))
    }

    /// One name fewer for `inode`; the inode itself if nothing holds it any more.
    fn drop_link(&mut self, inode: u64, now: SystemTime) -> Option<Inode> {
        let keep_orphans = self.keep_orphans;
        let entry = self.inodes.get_mut(&inode)?;
        // A name was found for it, so it counted that name.
        debug_assert!(entry.attributes.nlink > 0, "inode {inode} has a name and no link");
        entry.attributes.nlink = entry.attributes.nlink.saturating_sub(1);
        entry.attributes.ctime = now;
        if entry.attributes.nlink == 0 && !entry.held() && !keep_orphans {
            return self.inodes.remove(&inode);
        }
        None
    }

    /// Removes an empty directory. Returns it if it is gone for good (the kernel holds no
    /// reference to it); otherwise it stays, empty and without a name, until forgotten.
    pub fn rmdir(&mut self, parent: u64, name: &OsStr, now: SystemTime) -> FsResult<Option<Inode>> {
        let inode = self.lookup(parent, name)?;
        if !self.directory(inode)?.is_empty() {
            return Err(FsError::NotEmpty);
        }
        self.directory_mut(parent)?.remove(name);
        self.get_mut(parent)?.attributes.nlink -= 1;
        self.touch_directory(parent, now);
        let keep_orphans = self.keep_orphans;
        let entry = self.get_mut(inode)?;
        entry.attributes.nlink = 0;
        entry.attributes.ctime = now;
        if entry.held() || keep_orphans {
            return Ok(None);
        }
        Ok(self.inodes.remove(&inode))
    }

    /// Whether `ancestor` is `inode` or one of its ancestors.
    fn is_ancestor(&self, ancestor: u64, mut inode: u64) -> bool {
        loop {
            if inode == ancestor {
                return true;
            }
            match self.directory(inode) {
                Ok(directory) if directory.parent != inode => inode = directory.parent,
                _ => return false,
            }
        }
    }

    /// Moves `parent/name` to `new_parent/new_name`, replacing a file there or an empty directory
    /// (POSIX rename). With `no_replace` an existing target is `EEXIST`; with `exchange` the two
    /// swap. Returns an inode the replacement freed for good.
    // renameat2's operands and the time: a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        no_replace: bool,
        exchange: bool,
        now: SystemTime,
    ) -> FsResult<Option<Inode>> {
        check_name(new_name)?;
        let inode = self.lookup(parent, name)?;
        self.live_directory(new_parent)?;
        let is_directory = self.get(inode)?.attributes.kind == FileKind::Directory;
        if is_directory && self.is_ancestor(inode, new_parent) {
            return Err(FsError::Invalid("a directory cannot move into itself"));
        }
        let target = self.directory(new_parent)?.get(new_name);
        if target == Some(inode) {
            return Ok(None);
        }
        if exchange {
            let target = target.ok_or(FsError::NotFound)?;
            let target_is_directory = self.get(target)?.attributes.kind == FileKind::Directory;
            if target_is_directory && self.is_ancestor(target, parent) {
                return Err(FsError::Invalid("a directory cannot move into itself"));
            }
            self.directory_mut(parent)?.insert(name, target);
            self.directory_mut(new_parent)?.insert(new_name, inode);
            self.reparent(inode, parent, new_parent, is_directory)?;
            self.reparent(target, new_parent, parent, target_is_directory)?;
            self.touch_directory(parent, now);
            self.touch_directory(new_parent, now);
            return Ok(None);
        }
        let mut freed = None;
        if let Some(target) = target {
            if no_replace {
                return Err(FsError::Exists);
            }
            let target_is_directory = self.get(target)?.attributes.kind == FileKind::Directory;
            match (is_directory, target_is_directory) {
                (true, false) => return Err(FsError::NotDirectory),
                (false, true) => return Err(FsError::IsDirectory),
                (true, true) => freed = self.rmdir(new_parent, new_name, now)?,
                (false, false) => {
                    self.directory_mut(new_parent)?.remove(new_name);
                    freed = self.drop_link(target, now);
                }
            }
        }
        self.directory_mut(parent)?.remove(name);
        self.directory_mut(new_parent)?.insert(new_name, inode);
        self.reparent(inode, parent, new_parent, is_directory)?;
        self.get_mut(inode)?.attributes.ctime = now;
        self.touch_directory(parent, now);
        self.touch_directory(new_parent, now);
        Ok(freed)
    }

    /// A directory that moved from `old_parent` to `new_parent`: its `..` and the link counts.
    fn reparent(&mut self, inode: u64, old_parent: u64, new_parent: u64, is_directory: bool) -> FsResult<()> {
        if !is_directory || old_parent == new_parent {
            return Ok(());
        }
        self.directory_mut(inode)?.parent = new_parent;
        self.get_mut(old_parent)?.attributes.nlink -= 1;
        self.get_mut(new_parent)?.attributes.nlink += 1;
        Ok(())
    }

    pub fn open(&mut self, inode: u64) -> FsResult<()> {
        self.get_mut(inode)?.open_handles += 1;
        Ok(())
    }

    /// Closes a handle; returns the inode if it has no name and this was its last holder.
    pub fn release(&mut self, inode: u64) -> Option<Inode> {
        let entry = self.inodes.get_mut(&inode)?;
        entry.open_handles = entry.open_handles.saturating_sub(1);
        self.take_if_unheld(inode)
    }

    /// The kernel was given an entry for `inode` (lookup, create, mkdir, mknod, symlink, link).
    pub fn remember(&mut self, inode: u64) -> FsResult<()> {
        self.get_mut(inode)?.lookups += 1;
        Ok(())
    }

    /// The kernel dropped `count` of its references (forget); returns the inode if it has no
    /// name and this was its last holder. The root is never forgotten.
    pub fn forget(&mut self, inode: u64, count: u64) -> Option<Inode> {
        let entry = self.inodes.get_mut(&inode)?;
        entry.lookups = entry.lookups.saturating_sub(count);
        if inode == ROOT_INODE {
            return None;
        }
        self.take_if_unheld(inode)
    }

    fn take_if_unheld(&mut self, inode: u64) -> Option<Inode> {
        let entry = self.inodes.get(&inode)?;
        if entry.attributes.nlink == 0 && !entry.held() && inode != ROOT_INODE {
            return self.inodes.remove(&inode);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Creator = Creator { uid: 1000, gid: 1000, mode: 0o644 };

    fn file() -> Content {
        Content::File(ExtentMap::default())
    }

    fn directory() -> Content {
        Content::Directory(Directory::default())
    }

    #[test]
    fn rename_replaces_files_and_empty_directories_only() {
        let mut namespace = Namespace::new(ME, SystemTime::UNIX_EPOCH);
        let a = namespace.create(ROOT_INODE, OsStr::new("a"), ME, file(), SystemTime::UNIX_EPOCH).expect("a");
        let b = namespace.create(ROOT_INODE, OsStr::new("b"), ME, file(), SystemTime::UNIX_EPOCH).expect("b");
        let d = namespace
            .create(ROOT_INODE, OsStr::new("d"), ME, directory(), SystemTime::UNIX_EPOCH)
            .expect("d");
        let e = namespace
            .create(ROOT_INODE, OsStr::new("e"), ME, directory(), SystemTime::UNIX_EPOCH)
            .expect("e");
        namespace.create(e, OsStr::new("inner"), ME, file(), SystemTime::UNIX_EPOCH).expect("inner");
        let freed = namespace.rename(
            ROOT_INODE,
            OsStr::new("a"),
            ROOT_INODE,
            OsStr::new("b"),
            false,
            false,
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(freed.expect("rename").map(|inode| inode.attributes.inode), Some(b));
        assert_eq!(namespace.lookup(ROOT_INODE, OsStr::new("b")).ok(), Some(a));
        assert!(matches!(
            namespace.rename(
                ROOT_INODE,
                OsStr::new("b"),
                ROOT_INODE,
                OsStr::new("d"),
                false,
                false,
                SystemTime::UNIX_EPOCH
            ),
            Err(FsError::IsDirectory)
        ));
        assert!(matches!(
            namespace.rename(
                ROOT_INODE,
                OsStr::new("d"),
                ROOT_INODE,
                OsStr::new("e"),
                false,
                false,
                SystemTime::UNIX_EPOCH
            ),
            Err(FsError::NotEmpty)
        ));
        assert!(matches!(
            namespace.rename(
                ROOT_INODE,
                OsStr::new("d"),
                d,
                OsStr::new("x"),
                false,
                false,
                SystemTime::UNIX_EPOCH
            ),
            Err(FsError::Invalid(_))
        ));
        assert!(matches!(
            namespace.rename(
                ROOT_INODE,
                OsStr::new("b"),
                ROOT_INODE,
                OsStr::new("e"),
                true,
                false,
                SystemTime::UNIX_EPOCH
            ),
            Err(FsError::Exists)
        ));
        namespace
            .rename(ROOT_INODE, OsStr::new("d"), e, OsStr::new("moved"), false, false, SystemTime::UNIX_EPOCH)
            .expect("move");
        assert_eq!(namespace.directory(d).expect("d").parent, e);
        assert_eq!(namespace.get(ROOT_INODE).expect("root").attributes.nlink, 3);
        assert_eq!(namespace.get(e).expect("e").attributes.nlink, 3);
    }

    #[test]
    fn an_open_unlinked_file_lives_until_its_last_handle_closes() {
        let mut namespace = Namespace::new(ME, SystemTime::UNIX_EPOCH);
        let a = namespace.create(ROOT_INODE, OsStr::new("a"), ME, file(), SystemTime::UNIX_EPOCH).expect("a");
        namespace.open(a).expect("open");
        assert!(namespace
            .unlink(ROOT_INODE, OsStr::new("a"), SystemTime::UNIX_EPOCH)
            .expect("unlink")
            .is_none());
        assert!(namespace.get(a).is_ok());
        assert!(namespace.release(a).is_some());
        assert!(namespace.get(a).is_err());
    }

    #[test]
    fn readdir_resumes_after_removals() {
        let mut namespace = Namespace::new(ME, SystemTime::UNIX_EPOCH);
        for name in ["a", "b", "c", "d"] {
            namespace
                .create(ROOT_INODE, OsStr::new(name), ME, file(), SystemTime::UNIX_EPOCH)
                .expect("create");
        }
        let first: Vec<(u64, OsString)> = namespace
            .directory(ROOT_INODE)
            .expect("root")
            .after(0)
            .take(2)
            .map(|(cookie, name, _)| (cookie, name.to_owned()))
            .collect();
        namespace.unlink(ROOT_INODE, OsStr::new("a"), SystemTime::UNIX_EPOCH).expect("unlink a");
        namespace.unlink(ROOT_INODE, OsStr::new("b"), SystemTime::UNIX_EPOCH).expect("unlink b");
        let rest: Vec<OsString> = namespace
            .directory(ROOT_INODE)
            .expect("root")
            .after(first[1].0)
            .map(|(_, name, _)| name.to_owned())
            .collect();
        assert_eq!(rest, vec![OsString::from("c"), OsString::from("d")]);
        assert!(matches!(
            namespace.create(ROOT_INODE, OsStr::new(&"x".repeat(256)), ME, file(), SystemTime::UNIX_EPOCH),
            Err(FsError::NameTooLong { .. })
        ));
    }
}
