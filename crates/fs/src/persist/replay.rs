//! Replaying journal records onto the metadata, with no remem I/O.
//!
//! A record comes from disk, so it is checked as it is applied: every inode must exist and be
//! of the right kind, every name valid, every page run inside the address space and free when
//! it is taken (`Allocator::take`), every page a write names mapped. A record that does not
//! apply is an error naming it; nothing here panics on what a record says. Pages freed here
//! are not discarded one by one: `FileSystem::open` discards every free page afterwards.

use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

use crate::extents::ExtentMap;
use crate::filesystem::{FileSystem, MAX_FILE_BYTES};
use crate::namespace::{Attributes, Content, Creator, Directory, FileKind, Inode, MAX_SYMLINK_BYTES};
use crate::persist::record::{Record, Run};
use crate::store::PageStore;

fn file_mut(fs_inode: Option<&mut Inode>, inode: u64) -> Result<(&mut Attributes, &mut ExtentMap), String> {
    match fs_inode {
        Some(Inode { attributes, content: Content::File(extents), .. }) => Ok((attributes, extents)),
        Some(_) => Err(format!("inode {inode} is not a regular file")),
        None => Err(format!("inode {inode} does not exist")),
    }
}

impl<S: PageStore> FileSystem<S> {
    /// Frees the pages of an inode that is gone, without remem I/O (see the module docs).
    pub(crate) fn drop_inode_pages(&mut self, inode: Inode) {
        if let Content::File(mut extents) = inode.content {
            let mut runs = Vec::new();
            extents.clear(|remote, len| runs.push((remote, len)));
            self.forget_runs(&runs);
        }
    }

    /// Returns runs to the allocator; they are no longer unwritten pages of a file.
    pub(crate) fn forget_runs(&mut self, runs: &[(u64, u64)]) {
        for &(remote, len) in runs {
            self.unwritten.remove(remote, len);
            self.allocator.release(remote, len);
        }
    }

    /// Unmaps file pages `start..end` of `inode` and frees their runs (no I/O).
    fn unmap_quietly(&mut self, inode: u64, start: u64, end: u64) -> Result<(), String> {
        let (attributes, extents) = file_mut(self.namespace.get_mut(inode).ok(), inode)?;
        let mut runs = Vec::new();
        extents.unmap_range(start, end, |remote, len| runs.push((remote, len)));
        attributes.mapped_pages = extents.mapped_pages();
        self.forget_runs(&runs);
        Ok(())
    }

    /// Applies one journal record (see the module docs).
    pub(crate) fn apply(&mut self, record: &Record) -> Result<(), String> {
        let page_bytes = self.page_bytes as u64;
        let max_file_pages = MAX_FILE_BYTES / page_bytes;
        match record {
            Record::Create { parent, name, inode, kind, mode, uid, gid, time, target, rdev } => {
                let creator = Creator { uid: *uid, gid: *gid, mode: *mode };
                self.replay_create((*parent, name, *inode), (*kind, target.as_ref(), *rdev), creator, *time)?;
            }
            Record::Link { inode, parent, name, time } => {
                self.namespace
                    .link(*inode, *parent, name, *time)
                    .map_err(|error| format!("link {inode} as {name:?} in {parent}: {error}"))?
            }
            Record::Unlink { parent, name, time } => {
                // Orphans are kept while replaying (`keep_orphans`): nothing is returned.
                self.namespace
                    .unlink(*parent, name, *time)
                    .map_err(|error| format!("unlink {name:?} in {parent}: {error}"))?;
            }
            Record::Rmdir { parent, name, time } => {
                // Kept as an orphan while replaying; its `Release` record, if any, follows.
                self.namespace
                    .rmdir(*parent, name, *time)
                    .map_err(|error| format!("rmdir {name:?} in {parent}: {error}"))?;
            }
            Record::Rename { parent, name, new_parent, new_name, no_replace, exchange, time } => {
                self.namespace
                    .rename(*parent, name, *new_parent, new_name, *no_replace, *exchange, *time)
                    .map_err(|error| {
                        format!("rename {name:?} in {parent} to {new_name:?} in {new_parent}: {error}")
                    })?;
            }
            Record::SetAttributes { inode, mode, uid, gid, atime, mtime, ctime } => {
                let entry =
                    self.namespace.get_mut(*inode).map_err(|_| format!("inode {inode} does not exist"))?;
                let attributes = &mut entry.attributes;
                if let Some(mode) = mode {
                    attributes.mode = *mode;
                }
                attributes.uid = uid.unwrap_or(attributes.uid);
                attributes.gid = gid.unwrap_or(attributes.gid);
                attributes.atime = atime.unwrap_or(attributes.atime);
                attributes.mtime = mtime.unwrap_or(attributes.mtime);
                attributes.ctime = *ctime;
            }
            Record::Truncate { inode, size_bytes, time } => {
                if *size_bytes > MAX_FILE_BYTES {
                    return Err(format!("size {size_bytes}"));
                }
                self.unmap_quietly(*inode, size_bytes.div_ceil(page_bytes), u64::MAX)?;
                let (attributes, _) = file_mut(self.namespace.get_mut(*inode).ok(), *inode)?;
                attributes.size_bytes = *size_bytes;
                attributes.mtime = *time;
                attributes.ctime = *time;
            }
            Record::Write { inode, size_bytes, time, first_page, end_page } => {
                if first_page >= end_page || *end_page > max_file_pages || *size_bytes > MAX_FILE_BYTES {
                    return Err(format!("pages {first_page}..{end_page}, size {size_bytes}"));
                }
                let (attributes, extents) = file_mut(self.namespace.get_mut(*inode).ok(), *inode)?;
                if extents.unmapped_in(*first_page, *end_page) != 0 {
                    return Err(format!(
                        "inode {inode}: pages {first_page}..{end_page} written but not all mapped"
                    ));
                }
                let mut written = Vec::new();
                extents.for_each_run_in(*first_page, *end_page, |_, remote, len| written.push((remote, len)));
                attributes.size_bytes = *size_bytes;
                attributes.mtime = *time;
                attributes.ctime = *time;
                for (remote, len) in written {
                    self.unwritten.remove(remote, len);
                }
            }
            Record::Allocate { inode, runs, size_bytes, time } => {
                self.replay_allocate(*inode, runs, *size_bytes, *time)?;
            }
            Record::Punch { inode, first_page, end_page, time } => {
                if first_page < end_page {
                    self.unmap_quietly(*inode, *first_page, *end_page)?;
                }
                let (attributes, _) = file_mut(self.namespace.get_mut(*inode).ok(), *inode)?;
                attributes.mtime = *time;
                attributes.ctime = *time;
            }
            Record::Release { inode } => {
                let gone = self
                    .namespace
                    .remove_orphan(*inode)
                    .ok_or_else(|| format!("released inode {inode} does not exist or still has a name"))?;
                self.drop_inode_pages(gone);
            }
            Record::Times { inode, atime, mtime, ctime } => {
                let entry =
                    self.namespace.get_mut(*inode).map_err(|_| format!("inode {inode} does not exist"))?;
                entry.attributes.atime = *atime;
                entry.attributes.mtime = *mtime;
                entry.attributes.ctime = *ctime;
            }
        }
        Ok(())
    }

    /// A `Create` record: the inode it names must be the next one, its kind and target agree.
    fn replay_create(
        &mut self,
        (parent, name, inode): (u64, &OsStr, u64),
        (kind, target, rdev): (FileKind, Option<&OsString>, u32),
        creator: Creator,
        time: SystemTime,
    ) -> Result<(), String> {
        if inode != self.namespace.next_inode() {
            return Err(format!("creates inode {inode}, the next is {}", self.namespace.next_inode()));
        }
        if creator.mode > 0o7777 {
            return Err(format!("mode {:o}", creator.mode));
        }
        let content = match (kind, target) {
            (FileKind::File, None) => Content::File(ExtentMap::default()),
            (FileKind::Directory, None) => Content::Directory(Directory::default()),
            (FileKind::Symlink, Some(target)) if !target.is_empty() && target.len() <= MAX_SYMLINK_BYTES => {
                Content::Symlink(target.clone())
            }
            (kind, None) if kind.is_special() => Content::Special { kind, rdev },
            _ => return Err("a symlink without a valid target, or a target on another kind".into()),
        };
        let created = self
            .namespace
            .create(parent, name, creator, content, time)
            .map_err(|error| format!("create {name:?} in {parent}: {error}"))?;
        assert_eq!(created, inode, "the namespace numbers inodes in order");
        Ok(())
    }

    /// An `Allocate` record: every run must be free and inside the file.
    fn replay_allocate(
        &mut self,
        inode: u64,
        runs: &[Run],
        size_bytes: u64,
        time: Option<SystemTime>,
    ) -> Result<(), String> {
        let max_file_pages = MAX_FILE_BYTES / self.page_bytes as u64;
        if size_bytes > MAX_FILE_BYTES {
            return Err(format!("size {size_bytes}"));
        }
        let FileSystem { namespace, allocator, unwritten, .. } = self;
        let (attributes, extents) = file_mut(namespace.get_mut(inode).ok(), inode)?;
        for run in runs {
            let in_file = run.file_page.checked_add(run.len).is_some_and(|end| end <= max_file_pages);
            if !in_file || !allocator.take(run.remote, run.len) {
                return Err(format!("inode {inode}: run {run:?} is outside the file or not free"));
            }
            if !extents.insert_mapping(run.file_page, run.remote, run.len) {
                allocator.release(run.remote, run.len);
                return Err(format!("inode {inode}: run {run:?} overlaps the file's pages"));
            }
            unwritten.insert(run.remote, run.len);
        }
        attributes.mapped_pages = extents.mapped_pages();
        attributes.size_bytes = size_bytes;
        if let Some(time) = time {
            attributes.mtime = time;
            attributes.ctime = time;
        }
        Ok(())
    }
}
