//! `remem fs` mounted for real (FUSE, /dev/fuse) on real `remem node` processes, driven by
//! Debian's programs: fio with crc32c verify, tar in and out compared byte for byte, sqlite3,
//! coreutils and direct system calls for sparse files, truncate, fallocate, O_DIRECT, rename,
//! unlink and mkdir; two nodes SIGKILLed under writes (every byte reads back), a third killed
//! (EIO, never wrong bytes); restarts: SIGKILL of `remem fs`, clean unmount, `--fresh`, a torn
//! journal tail recovered and a corrupt journal refused, a second `remem fs` on the same state
//! refused.
//!
//! Needs root-free FUSE at least (/dev/fuse; the tests fail with the reason if it is missing).
//! Every mount is unmounted by a guard, also on panic (SIGTERM to `remem fs` by PID, then
//! `fusermount3 -u -z`, then `umount -l`); every external command runs under `timeout`.

use crate::common;
use crate::fs_support;

use common::run_ok;
use fs_support::{detach, fs_command, run_command, FsMount};

use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use remem::launcher::{LocalCluster, UnixSockets};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

fn test_dir(name: &str) -> common::ScratchDir {
    common::ScratchDir::new(&format!("fs-{name}"))
}

/// A cluster of ten nodes (1 MiB slabs, 16 each: 128 MiB of EC(8,2) data) and a mount on it.
/// (directory, cluster, mount): bound in this order, they drop mount first, directory last.
fn setup(name: &str, size: &str) -> (common::ScratchDir, LocalCluster, FsMount) {
    let dir = test_dir(name);
    let cluster = common::start_cluster("fs", name, 10, UnixSockets::None);
    let mount = FsMount::start(&cluster, &dir, size);
    (dir, cluster, mount)
}

fn pattern(offset: u64, len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64).map(|index| ((offset + index).wrapping_mul(0x9e37_79b9) ^ seed) as u8).collect()
}

#[test]
fn fio_crc32c_verify_passes_buffered_and_direct() {
    let (_dir, _cluster, mount) = setup("fio", "96MiB");
    let directory = mount.mountpoint.to_str().expect("utf-8 path").to_owned();
    for (name, direct) in [("buffered", "0"), ("direct", "1")] {
        let output = run_ok(
            120,
            "fio",
            &[
                &format!("--name={name}"),
                &format!("--directory={directory}"),
                "--rw=randwrite",
                "--bsrange=4k-64k",
                "--size=16m",
                "--ioengine=psync",
                &format!("--direct={direct}"),
                "--verify=crc32c",
                "--verify_fatal=1",
                "--do_verify=1",
                "--randrepeat=1",
                // No verify state file in the working directory (crates/cli) to leave behind.
                "--verify_state_save=0",
            ],
        );
        assert!(output.contains("err= 0"), "fio {name}: {output}");
    }
}

#[test]
fn tar_of_the_source_tree_comes_back_byte_for_byte() {
    let (dir, _cluster, mount) = setup("tar", "64MiB");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("crates/");
    let archive = dir.join("in.tar");
    let source_arg = source.to_str().expect("utf-8 path");
    let archive_arg = archive.to_str().expect("utf-8 path");
    run_ok(60, "tar", &["-C", source_arg, "--exclude=target", "-cf", archive_arg, "."]);
    let inside = mount.path("tree");
    std::fs::create_dir(&inside).expect("mkdir on remem fs");
    run_ok(60, "tar", &["-C", inside.to_str().expect("utf-8"), "-xf", archive_arg]);
    let out = dir.join("out");
    std::fs::create_dir(&out).expect("mkdir out");
    let archive_back = dir.join("back.tar");
    run_ok(
        60,
        "tar",
        &["-C", inside.to_str().expect("utf-8"), "-cf", archive_back.to_str().expect("utf-8"), "."],
    );
    run_ok(60, "tar", &["-C", out.to_str().expect("utf-8"), "-xf", archive_back.to_str().expect("utf-8")]);
    run_ok(60, "diff", &["-r", "--no-dereference", source_arg, out.to_str().expect("utf-8"), "-x", "target"]);
    // And the archive itself, written to and read from remem, compares equal.
    std::fs::copy(&archive, mount.path("in.tar")).expect("copy the archive in");
    run_ok(60, "cmp", &[archive_arg, mount.path("in.tar").to_str().expect("utf-8")]);
}

#[test]
fn sqlite3_databases_pass_integrity_check_in_rollback_and_wal_modes() {
    let (_dir, _cluster, mount) = setup("sqlite", "64MiB");
    for mode in ["delete", "wal"] {
        let database = mount.path(&format!("{mode}.sqlite"));
        let script = format!(
            "pragma journal_mode={mode};
             create table t(id integer primary key, body text);
             begin; insert into t(body) select hex(randomblob(200)) from generate_series(1, 5000); commit;
             update t set body = 'x' || body where id % 7 = 0;
             delete from t where id % 11 = 0;
             vacuum;
             pragma integrity_check;
             select count(*) from t;"
        );
        let output = run_ok(60, "sqlite3", &[database.to_str().expect("utf-8"), &script]);
        let lines: Vec<&str> = output.lines().collect();
        assert_eq!(lines[lines.len() - 2..], ["ok", "4546"], "sqlite3 ({mode}) said: {output}");
    }
}

fn fallocate(file: &std::fs::File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on a descriptor we own; no memory is passed.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, len as i64) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn sparse_files_truncate_fallocate_and_direct_io_behave_like_a_local_file_system() {
    let (_dir, _cluster, mount) = setup("sparse", "32MiB");
    let free_before = statfs_free_bytes(&mount.mountpoint);
    // A 1 TiB file holds only the pages written.
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(mount.path("big"))
        .expect("big");
    file.set_len(1 << 40).expect("1 TiB");
    file.seek(SeekFrom::Start((1 << 40) - 5000)).expect("seek");
    file.write_all(&pattern(0, 5000, 1)).expect("write the tail");
    assert_eq!(file.metadata().expect("stat").len(), 1 << 40);
    assert!(file.metadata().expect("stat").blocks() <= 3 * 8, "only the tail pages are allocated");
    let mut hole = vec![1u8; 1 << 20];
    file.seek(SeekFrom::Start(1 << 35)).expect("seek");
    file.read_exact(&mut hole).expect("read a hole");
    assert!(hole.iter().all(|&byte| byte == 0), "a hole reads as zeros");
    // Truncate down cuts the middle of a page: the cut bytes read as zeros after regrowing.
    file.set_len((1 << 40) - 3000).expect("shrink");
    file.set_len(1 << 40).expect("regrow");
    let mut tail = vec![0u8; 5000];
    file.seek(SeekFrom::Start((1 << 40) - 5000)).expect("seek");
    file.read_exact(&mut tail).expect("read the tail");
    assert_eq!(tail[..2000], pattern(0, 2000, 1)[..]);
    assert!(tail[2000..].iter().all(|&byte| byte == 0), "bytes cut by truncate come back as zeros");
    // fallocate reserves space (statfs shows it), punching a hole frees it and reads zeros.
    let reserved = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(mount.path("reserved"))
        .expect("reserved");
    fallocate(&reserved, 0, 0, 8 << 20).expect("fallocate 8 MiB");
    assert_eq!(reserved.metadata().expect("stat").len(), 8 << 20);
    assert!(free_before - statfs_free_bytes(&mount.mountpoint) >= 8 << 20, "fallocate takes space");
    (&reserved).write_all(&pattern(0, 8 << 20, 2)).expect("fill");
    fallocate(&reserved, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 4096 + 100, 1 << 20)
        .expect("punch");
    let content = std::fs::read(mount.path("reserved")).expect("read back");
    let mut expected = pattern(0, 8 << 20, 2);
    expected[4096 + 100..4096 + 100 + (1 << 20)].fill(0);
    assert!(content == expected, "a punched hole reads as zeros, the rest is intact");
    let error = fallocate(&reserved, 0, 0, 1 << 30).expect_err("more than the file system holds");
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC));
    // O_DIRECT (as loop devices use it): aligned writes and reads bypass the page cache.
    let mut direct = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(mount.path("direct"))
        .expect("open O_DIRECT");
    let layout = std::alloc::Layout::from_size_align(1 << 20, 4096).expect("layout");
    // SAFETY: the layout has a non-zero size; the buffer is freed below with the same layout.
    let buffer = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!buffer.is_null());
    // SAFETY: `buffer` is a live allocation of `layout.size()` bytes, used only here.
    let aligned = unsafe { std::slice::from_raw_parts_mut(buffer, layout.size()) };
    aligned.copy_from_slice(&pattern(0, 1 << 20, 3));
    direct.write_all(aligned).expect("O_DIRECT write");
    aligned.fill(0);
    direct.seek(SeekFrom::Start(0)).expect("seek");
    direct.read_exact(aligned).expect("O_DIRECT read");
    let same = aligned[..] == pattern(0, 1 << 20, 3)[..];
    // SAFETY: allocated above with this layout, no reference to it remains.
    unsafe { std::alloc::dealloc(buffer, layout) };
    assert!(same, "O_DIRECT reads back what it wrote");
    drop((file, reserved, direct));
    std::fs::remove_file(mount.path("big")).expect("unlink big");
    std::fs::remove_file(mount.path("reserved")).expect("unlink reserved");
    std::fs::remove_file(mount.path("direct")).expect("unlink direct");
    // The kernel sends the release of a closed file asynchronously: wait for it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while statfs_free_bytes(&mount.mountpoint) != free_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(statfs_free_bytes(&mount.mountpoint), free_before, "unlink returns every page");
}

fn statfs_free_bytes(path: &Path) -> u64 {
    let path = CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    // SAFETY: statfs fills the zeroed struct we pass; the path is a valid C string.
    let mut stats: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statfs(path.as_ptr(), &mut stats) }, 0, "statfs");
    stats.f_bfree * stats.f_bsize as u64
}

#[test]
fn rename_unlink_mkdir_and_rmdir_follow_posix() {
    let (_dir, _cluster, mount) = setup("names", "16MiB");
    let errno = |result: std::io::Result<()>| result.expect_err("must fail").raw_os_error();
    std::fs::create_dir(mount.path("a")).expect("mkdir a");
    assert_eq!(errno(std::fs::create_dir(mount.path("a"))), Some(libc::EEXIST));
    std::fs::write(mount.path("a/one"), b"one").expect("write one");
    std::fs::write(mount.path("two"), b"two").expect("write two");
    assert_eq!(errno(std::fs::remove_dir(mount.path("a"))), Some(libc::ENOTEMPTY));
    // Rename over a file replaces it atomically.
    std::fs::rename(mount.path("two"), mount.path("a/one")).expect("rename over");
    assert_eq!(std::fs::read(mount.path("a/one")).expect("read"), b"two");
    assert!(!mount.path("two").exists());
    // A directory onto a non-empty one, or into itself, fails.
    std::fs::create_dir(mount.path("b")).expect("mkdir b");
    assert_eq!(errno(std::fs::rename(mount.path("b"), mount.path("a"))), Some(libc::ENOTEMPTY));
    assert_eq!(errno(std::fs::rename(mount.path("a"), mount.path("a/inside"))), Some(libc::EINVAL));
    std::fs::rename(mount.path("a"), mount.path("b/a")).expect("move a into b");
    assert_eq!(std::fs::read(mount.path("b/a/one")).expect("read"), b"two");
    // An unlinked file stays readable through an open descriptor.
    let mut open = std::fs::File::open(mount.path("b/a/one")).expect("open");
    std::fs::remove_file(mount.path("b/a/one")).expect("unlink");
    let mut text = String::new();
    open.read_to_string(&mut text).expect("read after unlink");
    assert_eq!(text, "two");
    std::fs::remove_dir(mount.path("b/a")).expect("rmdir a");
    let names: Vec<String> = std::fs::read_dir(mount.path("b"))
        .expect("readdir")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.is_empty(), "b is empty: {names:?}");
    let long = "n".repeat(256);
    assert_eq!(errno(std::fs::write(mount.path(&long), b"x")), Some(libc::ENAMETOOLONG));
    // Many entries list completely, while being removed.
    for index in 0..300 {
        std::fs::write(mount.path(&format!("b/f{index}")), index.to_string()).expect("create");
    }
    assert_eq!(std::fs::read_dir(mount.path("b")).expect("readdir").count(), 300);
    run_ok(30, "rm", &["-r", mount.path("b").to_str().expect("utf-8")]);
    assert!(!mount.path("b").exists());
    std::fs::set_permissions(mount.path("."), std::os::unix::fs::PermissionsExt::from_mode(0o750))
        .expect("chmod");
    assert_eq!(std::fs::metadata(&mount.mountpoint).expect("stat").mode() & 0o777, 0o750);
}

#[test]
fn two_nodes_sigkilled_while_writing_lose_no_byte_and_a_third_gives_eio_k8_r2() {
    let (_dir, mut cluster, mount) = setup("kill", "64MiB");
    const CHUNK: usize = 256 << 10;
    const CHUNKS: u64 = 96;
    let path = mount.path("data");
    let mut file = std::fs::OpenOptions::new().create_new(true).write(true).open(&path).expect("create");
    for chunk in 0..CHUNKS {
        if chunk == 20 {
            cluster.kill(3).expect("kill node 3");
        }
        if chunk == 50 {
            cluster.kill(7).expect("kill node 7");
        }
        let offset = chunk * CHUNK as u64;
        file.write_all(&pattern(offset, CHUNK, 9)).expect("writes go on with two nodes down");
    }
    drop(file);
    // Read back with O_DIRECT, so every byte comes from remem and not the page cache.
    let read_all = |path: &Path| -> Vec<std::io::Result<bool>> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .expect("open O_DIRECT");
        let layout = std::alloc::Layout::from_size_align(CHUNK, 4096).expect("layout");
        // SAFETY: non-zero size; freed below with the same layout.
        let buffer = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!buffer.is_null());
        // SAFETY: a live allocation of CHUNK bytes, used only in this closure.
        let aligned = unsafe { std::slice::from_raw_parts_mut(buffer, CHUNK) };
        let mut results = Vec::new();
        for chunk in 0..CHUNKS {
            let offset = chunk * CHUNK as u64;
            let result = file.seek(SeekFrom::Start(offset)).and_then(|_| file.read_exact(aligned));
            results.push(result.map(|()| aligned[..] == pattern(offset, CHUNK, 9)[..]));
        }
        // SAFETY: allocated above with this layout; `aligned` is not used after this.
        unsafe { std::alloc::dealloc(buffer, layout) };
        results
    };
    for (chunk, result) in read_all(&path).into_iter().enumerate() {
        assert!(result.expect("reads survive two dead nodes"), "chunk {chunk} read back wrong");
    }
    // Beyond r: a third node dies. Reads fail with EIO; none returns wrong bytes.
    cluster.kill(5).expect("kill node 5");
    let results = read_all(&path);
    let failed = results.iter().filter(|result| result.is_err()).count();
    for (chunk, result) in results.into_iter().enumerate() {
        match result {
            Ok(same) => assert!(same, "chunk {chunk} read back wrong with three nodes down"),
            Err(error) => assert_eq!(error.raw_os_error(), Some(libc::EIO), "chunk {chunk}: {error}"),
        }
    }
    assert!(failed > 0, "with 3 of 10 nodes of every EC(8,2) range down, reads must fail");
}

/// One entry of a tree as `lstat` and `read` see it.
#[derive(Debug, PartialEq)]
struct Entry {
    path: PathBuf,
    inode: u64,
    mode: u32,
    nlink: u64,
    size: u64,
    blocks: u64,
    mtime: Option<(i64, i64)>,
    target: Option<PathBuf>,
    /// Whole content of files up to 16 MiB; of larger (sparse) ones, 64 KiB at a few offsets.
    content: Vec<u8>,
}

/// Every entry under `root`, in path order. `lazy_mtime` names files whose mtime may lag after a
/// SIGKILL (changed by overwrites only, journaled within a second, docs/FS.md).
fn walk(root: &Path, lazy_mtime: &[&str]) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(directory) = pending.pop() {
        for item in std::fs::read_dir(&directory).expect("readdir") {
            let path = item.expect("entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let relative = path.strip_prefix(root).expect("under root").to_path_buf();
            let mut content = Vec::new();
            let mut target = None;
            if meta.file_type().is_dir() {
                pending.push(path.clone());
            } else if meta.file_type().is_symlink() {
                target = Some(std::fs::read_link(&path).expect("readlink"));
            } else if meta.len() <= 16 << 20 {
                content = std::fs::read(&path).expect("read");
            } else {
                let mut file = std::fs::File::open(&path).expect("open");
                for offset in [0, 300 << 20, meta.len() - (64 << 10)] {
                    let mut chunk = vec![0u8; 64 << 10];
                    file.seek(SeekFrom::Start(offset)).expect("seek");
                    file.read_exact(&mut chunk).expect("read a chunk");
                    content.extend_from_slice(&chunk);
                }
            }
            let lazy = lazy_mtime.iter().any(|name| relative == Path::new(name));
            entries.push(Entry {
                inode: meta.ino(),
                mode: meta.mode(),
                nlink: meta.nlink(),
                size: meta.len(),
                blocks: meta.blocks(),
                mtime: (!lazy && !meta.file_type().is_dir()).then(|| (meta.mtime(), meta.mtime_nsec())),
                target,
                content,
                path: relative,
            });
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    entries
}

fn assert_same_tree(before: &[Entry], after: &[Entry], when: &str) {
    assert_eq!(before.len(), after.len(), "{when}: entry count");
    for (old, new) in before.iter().zip(after) {
        assert!(
            old == new,
            "{when}: {} differs:\nbefore {:?}\nafter  {:?}",
            old.path.display(),
            short(old),
            short(new)
        );
    }
}

fn short(entry: &Entry) -> String {
    format!(
        "ino {} mode {:o} nlink {} size {} blocks {} mtime {:?} target {:?} content {} bytes",
        entry.inode,
        entry.mode,
        entry.nlink,
        entry.size,
        entry.blocks,
        entry.mtime,
        entry.target,
        entry.content.len()
    )
}

/// Fills a mount with what a restart must keep: a copy of crates/, a sparse 1 GiB file with data
/// at three offsets, a fallocated range past its end, a symlink, a hard link, a renamed file, a
/// deleted file, a chmod, an empty directory. Returns the names whose mtime is kept lazily.
fn fill_tree(mount: &FsMount, dir: &Path) -> Vec<&'static str> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("crates/");
    let archive = dir.join("in.tar");
    let archive_arg = archive.to_str().expect("utf-8 path");
    run_ok(60, "tar", &["-C", source.to_str().expect("utf-8"), "--exclude=target", "-cf", archive_arg, "."]);
    std::fs::create_dir(mount.path("tree")).expect("mkdir tree");
    run_ok(60, "tar", &["-C", mount.path("tree").to_str().expect("utf-8"), "-xf", archive_arg]);
    let sparse =
        std::fs::OpenOptions::new().create_new(true).write(true).open(mount.path("sparse")).expect("sparse");
    sparse.set_len(1 << 30).expect("1 GiB");
    for (offset, seed) in [(0u64, 1u64), ((300 << 20) + 123, 2), ((1 << 30) - 70_000, 3)] {
        use std::os::unix::fs::FileExt;
        sparse.write_all_at(&pattern(offset, 70_000, seed), offset).expect("write into the sparse file");
    }
    fallocate(&sparse, libc::FALLOC_FL_KEEP_SIZE, 1 << 30, 1 << 20).expect("fallocate past the end");
    drop(sparse);
    std::os::unix::fs::symlink("tree/fs/Cargo.toml", mount.path("link")).expect("symlink");
    std::fs::hard_link(mount.path("tree/fs/src/lib.rs"), mount.path("hard")).expect("hard link");
    std::fs::write(mount.path("before"), pattern(0, 10_000, 4)).expect("before");
    std::fs::rename(mount.path("before"), mount.path("tree/after")).expect("rename");
    std::fs::write(mount.path("gone"), pattern(0, 50_000, 5)).expect("gone");
    std::fs::remove_file(mount.path("gone")).expect("unlink");
    std::fs::set_permissions(mount.path("hard"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    std::fs::create_dir(mount.path("empty")).expect("mkdir empty");
    vec!["sparse"]
}

#[test]
fn files_survive_sigkill_of_remem_fs_a_clean_remount_and_fresh_starts_empty() {
    let dir = test_dir("restart");
    let cluster = common::start_cluster("fs", "restart", 10, UnixSockets::None);
    let mount = FsMount::start(&cluster, &dir, "64MiB");
    let lazy = fill_tree(&mount, &dir);
    let before = walk(&mount.mountpoint, &lazy);
    assert!(before.len() > 200, "the tree was copied: {} entries", before.len());

    // SIGKILL: no unmount, no sync. Every reply it gave was journaled first.
    mount.sigkill();
    detach(&dir.join("mnt"));
    let mount = FsMount::start(&cluster, &dir, "64MiB");
    let log = mount.log_text();
    assert!(log.contains("reopened") && log.contains("--fresh"), "remem fs says it reopened: {log}");
    assert_same_tree(&before, &walk(&mount.mountpoint, &lazy), "after SIGKILL");

    // A second remem fs on the same state directory is refused while this one runs.
    let other = dir.join("other");
    std::fs::create_dir_all(other.join("mnt")).expect("second mount point");
    let mut second = fs_command(&cluster, &other, "64MiB", &[]);
    second.arg("--name").arg(default_name(&dir.join("mnt")));
    let output = run_command(second);
    assert!(!output.status.success(), "a second remem fs on the same state must be refused");
    assert!(String::from_utf8_lossy(&output.stderr).contains("in use"), "{output:?}");

    // A clean unmount (SIGTERM) and a remount: everything, lazy mtimes included.
    let before = walk(&mount.mountpoint, &[]);
    mount.stop();
    let mount = FsMount::start(&cluster, &dir, "64MiB");
    assert_same_tree(&before, &walk(&mount.mountpoint, &[]), "after a clean remount");

    // A different size is refused, naming --fresh; --fresh starts empty.
    mount.stop();
    let output = run_command(fs_command(&cluster, &dir, "32MiB", &[]));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--fresh"), "{output:?}");
    let mount = FsMount::start_with(&cluster, &dir, "64MiB", &["--fresh"]);
    assert_eq!(std::fs::read_dir(&mount.mountpoint).expect("readdir").count(), 0, "--fresh starts empty");
    assert_eq!(statfs_free_bytes(&mount.mountpoint), 64 << 20, "and with every page free");
}

/// The default state NAME of a mount point (as `remem fs` derives it).
fn default_name(mountpoint: &Path) -> String {
    let canonical = mountpoint.canonicalize().expect("mount point");
    canonical.to_string_lossy().trim_matches('/').replace('/', "-")
}

/// Byte offsets where each record of a journal starts, and its end.
fn journal_records(journal: &[u8]) -> Vec<(usize, usize)> {
    let mut records = Vec::new();
    let mut offset = 0;
    while offset + 8 <= journal.len() {
        let len = u32::from_le_bytes(journal[offset..offset + 4].try_into().expect("4 bytes")) as usize;
        records.push((offset, offset + 8 + len));
        offset += 8 + len;
    }
    records
}

#[test]
fn a_torn_journal_tail_is_recovered_and_a_corrupt_middle_is_refused() {
    let dir = test_dir("journal");
    let cluster = common::start_cluster("fs", "journal", 10, UnixSockets::None);
    let state = dir.join("state");
    let state_arg = state.to_str().expect("utf-8").to_owned();
    let mount = FsMount::start_with(&cluster, &dir, "16MiB", &["--state", &state_arg]);
    for index in 0..20 {
        std::fs::write(mount.path(&format!("f{index}")), pattern(index, 5000, 6)).expect("write");
    }
    std::fs::create_dir(mount.path("last")).expect("mkdir: the last record");
    let before = walk(&mount.mountpoint, &[]);
    mount.sigkill();
    detach(&dir.join("mnt"));

    let journal_path = state.join("journal");
    let journal = std::fs::read(&journal_path).expect("journal");
    let records = journal_records(&journal);
    assert!(records.len() > 40, "{} records", records.len());
    assert_eq!(records.last().expect("records").1, journal.len(), "whole records only");

    // A flipped byte in the middle: refused, with the reason, and nothing mounted.
    let mut damaged = journal.clone();
    damaged[records[5].0 + 12] ^= 0x20;
    std::fs::write(&journal_path, &damaged).expect("damage");
    let output = run_command(fs_command(&cluster, &dir, "16MiB", &["--state", &state_arg]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("corrupt record"), "{output:?}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("mounted"), "{output:?}");

    // The last record cut in half (a crash mid-append): everything before it comes back.
    let (last_start, last_end) = *records.last().expect("records");
    std::fs::write(&journal_path, &journal[..(last_start + last_end) / 2]).expect("cut");
    let mount = FsMount::start_with(&cluster, &dir, "16MiB", &["--state", &state_arg]);
    assert!(mount.log_text().contains("torn record"), "reported: {}", mount.log_text());
    let expected: Vec<Entry> = before.into_iter().filter(|entry| entry.path != Path::new("last")).collect();
    assert_same_tree(&expected, &walk(&mount.mountpoint, &[]), "after a torn tail");
}

/// The mounted file system's client follows the cluster file: a node added while it runs
/// joins, so when a node dies its slabs are rebuilt there (ten nodes hold every EC(8,2) range
/// with no spare); after that two more nodes can die and every byte still reads back.
#[test]
fn a_node_added_to_the_cluster_file_joins_and_takes_the_rebuilt_slabs() {
    let (_dir, mut cluster, mount) = setup("follow", "32MiB");
    let path = mount.path("data");
    let data = pattern(0, 32 << 20, 11);
    std::fs::write(&path, &data).expect("write 32 MiB");
    let status = |cluster: &LocalCluster| -> serde_json::Value {
        let file = cluster.cluster_file_path.to_string_lossy().into_owned();
        let text = common::remem_status(30, &["--json", "--timeout-ms", "2000", "--cluster", &file]);
        serde_json::from_str(&text).expect("status JSON")
    };
    let wait = |cluster: &LocalCluster, what: &str, done: &dyn Fn(&serde_json::Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = status(cluster);
            if done(&status) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {status:#}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let options = common::cluster_options("fs", "follow", 10, UnixSockets::None);
    let added = cluster.add_node(binary(), &options).expect("a node is added");
    wait(&cluster, "the new node never had the file system's client", &|status| {
        status["nodes"][added]["clients"] == 1
    });
    cluster.kill(0).expect("SIGKILL node 0");
    let killed_at = Instant::now();
    // Every range had a split on node 0 and no spare node but the added one: one slab of each
    // range is rebuilt there. Done when a report the client wrote after the kill says every
    // range is healthy (until its rebuild ends a range reports as rebuilding).
    wait(&cluster, "the lost slabs were not rebuilt on the added node", &|status| {
        let (node, client) = (&status["nodes"][added], &status["clients"][0]);
        let region = &client["regions"][0];
        let written_after_kill =
            client["age_secs"].as_f64().is_some_and(|age| age + 0.05 < killed_at.elapsed().as_secs_f64());
        written_after_kill
            && region["ranges"].as_u64().is_some()
            && node["slabs_mapped"] == region["ranges"]
            && region["healthy"] == region["ranges"]
    });
    cluster.kill(1).expect("SIGKILL node 1");
    cluster.kill(2).expect("SIGKILL node 2");
    let mut file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path).expect("open");
    let layout = std::alloc::Layout::from_size_align(1 << 20, 4096).expect("layout");
    // SAFETY: non-zero size; freed below with the same layout.
    let buffer = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!buffer.is_null());
    // SAFETY: a live allocation of 1 MiB, used only here.
    let aligned = unsafe { std::slice::from_raw_parts_mut(buffer, 1 << 20) };
    for (index, expected) in data.chunks(1 << 20).enumerate() {
        file.read_exact(aligned).unwrap_or_else(|error| panic!("MiB {index} with three nodes dead: {error}"));
        assert!(aligned[..] == expected[..], "MiB {index} read back wrong");
    }
    // SAFETY: allocated above with this layout; `aligned` is not used after this.
    unsafe { std::alloc::dealloc(buffer, layout) };
}

/// Eight threads write unaligned byte ranges in 512-byte slots that share pages (every page
/// holds slots of every thread, so the read-modify-writes of concurrent requests on one page
/// must not lose each other's bytes) and read their slots back, with `O_DIRECT` (every call a
/// FUSE request; parallel direct writes are on); then the whole file is compared. Then fio
/// keeps 32 asynchronous `O_DIRECT` requests in flight per job (libaio, the way a loop device
/// sends them), with crc32c verify.
#[test]
fn concurrent_reads_and_writes_from_many_threads_return_exactly_the_bytes_written() {
    const THREADS: usize = 8;
    const SLOT: usize = 512;
    const FILE_BYTES: usize = 64 * 4096;
    const ROUNDS: u64 = 300;
    let (_dir, _cluster, mount) = setup("concurrent", "64MiB");
    let path = mount.path("shared");
    std::fs::write(&path, vec![0u8; FILE_BYTES]).expect("create the file");
    let open_direct = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .expect("open O_DIRECT")
    };
    let slots_per_thread = FILE_BYTES / SLOT / THREADS;
    let models: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let file = open_direct();
                scope.spawn(move || {
                    use std::os::unix::fs::FileExt;
                    let mut model = vec![0u8; FILE_BYTES];
                    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ thread as u64;
                    for round in 0..ROUNDS {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let slot = (state as usize % slots_per_thread) * THREADS + thread;
                        let start = slot * SLOT + (state >> 20) as usize % 200;
                        let len = 1 + (state >> 40) as usize % (slot * SLOT + SLOT - start);
                        let data = pattern(start as u64, len, round ^ (thread as u64) << 32);
                        file.write_all_at(&data, start as u64).expect("pwrite");
                        model[start..start + len].copy_from_slice(&data);
                        let check = ((state >> 48) as usize % slots_per_thread) * THREADS + thread;
                        let mut read = vec![0u8; SLOT];
                        file.read_exact_at(&mut read, (check * SLOT) as u64).expect("pread");
                        assert_eq!(
                            read,
                            model[check * SLOT..][..SLOT],
                            "thread {thread}, round {round}, slot {check}"
                        );
                    }
                    model
                })
            })
            .collect();
        threads.into_iter().map(|thread| thread.join().expect("a writer panicked")).collect()
    });
    let mut whole = vec![0u8; FILE_BYTES];
    std::os::unix::fs::FileExt::read_exact_at(&open_direct(), &mut whole, 0).expect("read the file");
    for slot in 0..FILE_BYTES / SLOT {
        let owner = &models[slot % THREADS];
        assert_eq!(whole[slot * SLOT..][..SLOT], owner[slot * SLOT..][..SLOT], "slot {slot}");
    }

    let directory = mount.mountpoint.to_str().expect("utf-8 path").to_owned();
    let output = run_ok(
        180,
        "fio",
        &[
            "--name=async",
            &format!("--directory={directory}"),
            "--rw=randwrite",
            "--bsrange=4k-64k",
            "--size=8m",
            "--numjobs=2",
            "--ioengine=libaio",
            "--iodepth=32",
            "--direct=1",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--verify_state_save=0",
            "--randrepeat=1",
        ],
    );
    assert!(output.contains("err= 0"), "fio: {output}");
}
