//! POSIX rules the file system itself must keep (the kernel checks permissions, through
//! `default_permissions`): special files as metadata only, set-group-ID directories, and inode
//! lifetimes that follow the kernel's references (lookups and forgets) as well as names and
//! open handles. Each test names the rule; pjdfstest checks the same through a real mount
//! (crates/cli/tests/integration/fs_posix.rs).

use std::ffi::OsStr;

use crate::error::FsError;
use crate::filesystem::{FileSystem, SetAttributes};
use crate::namespace::{Creator, FileKind, ROOT_INODE};
use crate::store::MemoryStore;

const ROOT: Creator = Creator { uid: 0, gid: 0, mode: 0o755 };
const USER: Creator = Creator { uid: 1000, gid: 1000, mode: 0o644 };

fn file_system(pages: u64) -> FileSystem<MemoryStore> {
    FileSystem::new(MemoryStore::new(4096, pages), ROOT)
}

fn name(text: &str) -> &OsStr {
    OsStr::new(text)
}

#[test]
fn fifos_devices_and_sockets_are_metadata_without_pages() {
    let mut fs = file_system(8);
    let kinds = [
        ("fifo", FileKind::Fifo, 77, 0),
        ("char", FileKind::CharDevice, 0x0103, 0x0103),
        ("block", FileKind::BlockDevice, 0x0801, 0x0801),
        ("socket", FileKind::Socket, 9, 0),
    ];
    for (file, kind, rdev, expected_rdev) in kinds {
        let attributes = fs.mknod(ROOT_INODE, name(file), USER, kind, rdev).expect("mknod");
        assert_eq!((attributes.kind, attributes.rdev), (kind, expected_rdev), "{file}");
        assert_eq!((attributes.size_bytes, attributes.mapped_pages, attributes.nlink), (0, 0, 1));
        assert_eq!((attributes.mode, attributes.uid, attributes.gid), (0o644, 1000, 1000));
        // The kernel serves their data itself: a request for it here is refused, never served.
        assert!(matches!(fs.write(attributes.inode, 0, b"x"), Err(FsError::Invalid(_))));
        assert!(matches!(fs.read(attributes.inode, 0, 1), Err(FsError::Invalid(_))));
    }
    let mut listed = Vec::new();
    fs.readdir(ROOT_INODE, 2, |_, _, kind, entry| {
        listed.push((entry.to_owned(), kind));
        false
    })
    .expect("readdir");
    assert_eq!(listed.len(), 4);
    assert!(listed.contains(&("fifo".into(), FileKind::Fifo)));
    assert!(listed.contains(&("block".into(), FileKind::BlockDevice)));
    assert!(matches!(fs.mknod(ROOT_INODE, name("f"), USER, FileKind::File, 0), Err(FsError::Invalid(_))));
    assert!(matches!(fs.mknod(ROOT_INODE, name("fifo"), USER, FileKind::Fifo, 0), Err(FsError::Exists)));
    fs.unlink(ROOT_INODE, name("char")).expect("unlink a device");
    assert_eq!(fs.usage().free_pages, 8, "no special file ever took a page");
}

#[test]
fn a_set_group_id_directory_gives_its_group_to_new_nodes_and_its_bit_to_subdirectories() {
    let mut fs = file_system(8);
    let shared = fs.mkdir(ROOT_INODE, name("shared"), ROOT).expect("mkdir").inode;
    let changes = SetAttributes { mode: Some(0o2777), gid: Some(50), ..SetAttributes::default() };
    fs.setattr(shared, changes).expect("chmod g+s, chgrp 50");
    let file = fs.create_file(shared, name("file"), USER).expect("create");
    assert_eq!((file.gid, file.mode), (50, 0o644), "a file takes the group, not the bit");
    let directory = fs.mkdir(shared, name("sub"), Creator { mode: 0o755, ..USER }).expect("mkdir");
    assert_eq!((directory.gid, directory.mode), (50, 0o2755), "a subdirectory takes both");
    let fifo = fs.mknod(directory.inode, name("fifo"), USER, FileKind::Fifo, 0).expect("mknod");
    assert_eq!(fifo.gid, 50, "inherited again one level down");
    let link = fs.symlink(shared, name("link"), name("file"), USER).expect("symlink");
    assert_eq!(link.gid, 50);
    let plain = fs.create_file(ROOT_INODE, name("plain"), USER).expect("create outside");
    assert_eq!(plain.gid, 1000, "elsewhere a node takes its creator's group");
}

#[test]
fn an_unlinked_file_the_kernel_still_holds_lives_until_forgotten() {
    let mut fs = file_system(8);
    let file = fs.create_file(ROOT_INODE, name("f"), USER).expect("create").inode;
    fs.remember(file).expect("entry given to the kernel");
    fs.write(file, 0, &[7; 5000]).expect("write two pages");
    fs.unlink(ROOT_INODE, name("f")).expect("unlink");
    let attributes = fs.getattr(file).expect("still there for the kernel");
    assert_eq!((attributes.nlink, attributes.size_bytes), (0, 5000));
    assert_eq!(fs.read(file, 0, 5000).expect("read").to_vec(), vec![7; 5000]);
    assert_eq!(fs.usage().free_pages, 6);
    // Held by an open handle and a lookup: both must let go.
    fs.open(file).expect("open by inode");
    fs.forget(file, 1).expect("forget");
    assert!(fs.getattr(file).is_ok(), "the open handle still holds it");
    fs.release(file).expect("release");
    assert!(matches!(fs.getattr(file), Err(FsError::NotFound)));
    assert_eq!(fs.usage().free_pages, 8, "its pages are freed with it");
}

#[test]
fn a_file_replaced_by_rename_stays_readable_through_the_kernel_until_forgotten() {
    let mut fs = file_system(8);
    let target = fs.create_file(ROOT_INODE, name("target"), USER).expect("create").inode;
    fs.write(target, 0, b"old").expect("write");
    // A reader looked the name up just before the rename: the kernel will open this inode.
    fs.remember(target).expect("looked up");
    let replacement = fs.create_file(ROOT_INODE, name("tmp"), USER).expect("create").inode;
    fs.write(replacement, 0, b"new").expect("write");
    fs.rename(ROOT_INODE, name("tmp"), ROOT_INODE, name("target"), false, false).expect("rename");
    assert_eq!(fs.lookup(ROOT_INODE, name("target")).expect("lookup").inode, replacement);
    assert_eq!(fs.open(target).expect("the open that raced the rename"), FileKind::File);
    assert_eq!(fs.read(target, 0, 3).expect("read").to_vec(), b"old");
    fs.release(target).expect("release");
    fs.forget(target, 1).expect("forget");
    assert!(matches!(fs.getattr(target), Err(FsError::NotFound)));
    // Forgetting more than was looked up, or an inode that is gone, changes nothing.
    fs.forget(target, 5).expect("forget again");
    fs.forget(ROOT_INODE, 1).expect("the root is never freed");
    assert!(fs.getattr(ROOT_INODE).is_ok());
}

#[test]
fn a_removed_directory_the_kernel_still_holds_stays_empty_until_forgotten() {
    let mut fs = file_system(8);
    let directory = fs.mkdir(ROOT_INODE, name("d"), USER).expect("mkdir").inode;
    fs.remember(directory).expect("looked up (a process's working directory)");
    fs.rmdir(ROOT_INODE, name("d")).expect("rmdir");
    assert_eq!(fs.getattr(directory).expect("still held").nlink, 0);
    assert_eq!(fs.getattr(ROOT_INODE).expect("root").nlink, 2);
    assert!(matches!(fs.create_file(directory, name("x"), USER), Err(FsError::NotFound)));
    assert!(matches!(fs.mkdir(directory, name("x"), USER), Err(FsError::NotFound)));
    let file = fs.create_file(ROOT_INODE, name("f"), USER).expect("create").inode;
    assert!(matches!(fs.link(file, directory, name("x")), Err(FsError::NotFound)));
    assert!(matches!(
        fs.rename(ROOT_INODE, name("f"), directory, name("x"), false, false),
        Err(FsError::NotFound)
    ));
    fs.forget(directory, 1).expect("forget");
    assert!(matches!(fs.getattr(directory), Err(FsError::NotFound)));
}
