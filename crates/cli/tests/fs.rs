//! `remem fs` mounted for real (FUSE, /dev/fuse) on real `remem node` processes, driven by
//! Debian's programs: fio with crc32c verify, tar in and out compared byte for byte, sqlite3,
//! coreutils and direct system calls for sparse files, truncate, fallocate, O_DIRECT, rename,
//! unlink and mkdir; two nodes SIGKILLed under writes (every byte reads back), a third killed
//! (EIO, never wrong bytes).
//!
//! Needs root-free FUSE at least (/dev/fuse; the tests fail with the reason if it is missing).
//! Every mount is unmounted by a guard, also on panic (SIGTERM to `remem fs` by PID, then
//! `fusermount3 -u -z`, then `umount -l`); every external command runs under `timeout`.

#[allow(dead_code)] // the shared helpers this test does not use
mod common;

use common::run_ok;

use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use remem::launcher::{LocalCluster, UnixSockets};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// A `remem fs` process and its mount; unmounted and stopped on drop, whatever happened.
struct FsMount {
    child: Child,
    mountpoint: PathBuf,
    log: PathBuf,
}

impl FsMount {
    fn start(cluster: &LocalCluster, dir: &Path, size: &str) -> FsMount {
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: these tests need FUSE (modprobe fuse, or pass the device into the container)"
        );
        let mountpoint = dir.join("mnt");
        std::fs::create_dir_all(&mountpoint).expect("mount point");
        let log = dir.join("fs.log");
        let mut command = Command::new(binary());
        command.arg("fs").arg(&mountpoint).arg("--cluster").arg(&cluster.cluster_file_path).args([
            "--size",
            size,
            "-k",
            "8",
            "-r",
            "2",
            "--request-timeout-ms",
            "1000",
        ]);
        let (child, line) = common::spawn_with_first_line(command, &log);
        let mount = FsMount { child, mountpoint, log };
        assert!(
            line.starts_with("mounted "),
            "remem fs did not mount: {line:?}; log: {}",
            std::fs::read_to_string(&mount.log).unwrap_or_default()
        );
        mount
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mountpoint.join(name)
    }
}

impl Drop for FsMount {
    fn drop(&mut self) {
        // SAFETY: kill with the PID of a child we spawned and have not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Whatever the daemon managed, leave no mount behind (a no-op when it unmounted).
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(&self.mountpoint)
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).stderr(Stdio::null()).status();
    }
}

fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("remem-fs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    dir
}

/// A cluster of ten nodes (1 MiB slabs, 16 each: 128 MiB of EC(8,2) data) and a mount on it.
fn setup(name: &str, size: &str) -> (LocalCluster, FsMount, PathBuf) {
    let dir = test_dir(name);
    let cluster = common::start_cluster("fs", name, 10, UnixSockets::None);
    let mount = FsMount::start(&cluster, &dir, size);
    (cluster, mount, dir)
}

fn pattern(offset: u64, len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64).map(|index| ((offset + index).wrapping_mul(0x9e37_79b9) ^ seed) as u8).collect()
}

#[test]
fn fio_crc32c_verify_passes_buffered_and_direct() {
    let (_cluster, mount, _dir) = setup("fio", "96MiB");
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
            ],
        );
        assert!(output.contains("err= 0"), "fio {name}: {output}");
    }
}

#[test]
fn tar_of_the_source_tree_comes_back_byte_for_byte() {
    let (_cluster, mount, dir) = setup("tar", "64MiB");
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
    let (_cluster, mount, _dir) = setup("sqlite", "64MiB");
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
    let (_cluster, mount, _dir) = setup("sparse", "32MiB");
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
    let (_cluster, mount, _dir) = setup("names", "16MiB");
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
    let (mut cluster, mount, _dir) = setup("kill", "64MiB");
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
