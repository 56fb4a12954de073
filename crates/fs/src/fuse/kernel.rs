//! The kernel's types from the file system's: errnos, file types and attributes, the creator
//! of a new node, open flags and times.

use std::time::SystemTime;

use fuser::{Errno, FileAttr, FileType, FopenFlags, INodeNo, Request, TimeOrNow};

use crate::error::FsError;
use crate::namespace::{Attributes, Creator, FileKind};

pub(super) fn errno(error: &FsError) -> Errno {
    if let FsError::Page(page_error) = error {
        // Logged here, where the error is handled: the kernel only sees EIO.
        tracing::warn!(%page_error, "remem page error: EIO");
    }
    Errno::from_i32(error.errno())
}

pub(super) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Socket => FileType::Socket,
    }
}

pub(super) fn file_attr(attributes: &Attributes, page_bytes: usize) -> FileAttr {
    FileAttr {
        ino: INodeNo(attributes.inode),
        size: attributes.size_bytes,
        blocks: attributes.mapped_pages.saturating_mul(page_bytes as u64 / 512),
        atime: attributes.atime,
        mtime: attributes.mtime,
        ctime: attributes.ctime,
        crtime: attributes.crtime,
        kind: file_type(attributes.kind),
        perm: attributes.mode,
        nlink: attributes.nlink,
        uid: attributes.uid,
        gid: attributes.gid,
        rdev: attributes.rdev,
        blksize: page_bytes as u32,
        flags: 0,
    }
}

pub(super) fn creator(request: &Request, mode: u32, umask: u32) -> Creator {
    Creator { uid: request.uid(), gid: request.gid(), mode: (mode & !umask & 0o7777) as u16 }
}

/// `FOPEN_DIRECT_IO` for opens with `O_DIRECT` (loop devices with `--direct-io=on`): their
/// reads and writes bypass the page cache and reach us as they are issued, and writes that do
/// not grow the file may be in flight together (`FOPEN_PARALLEL_DIRECT_WRITES`: the kernel
/// takes the inode lock shared for them), so they can share a batch. Other opens use the page
/// cache, so mmap works and small reads are served from it.
pub(super) fn open_flags(flags: i32) -> FopenFlags {
    if flags & libc::O_DIRECT != 0 {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
    } else {
        FopenFlags::empty()
    }
}

pub(super) fn time(value: TimeOrNow) -> SystemTime {
    match value {
        TimeOrNow::SpecificTime(time) => time,
        TimeOrNow::Now => SystemTime::now(),
    }
}
