//! `remem fs` ends leave no dead mount: SIGTERM and SIGINT with a file held open detach the mount
//! (lazily), and a `remem fs` started on a mount point a SIGKILLed one left dead (ENOTCONN)
//! detaches it and mounts. Real FUSE mounts on real node processes; every mount is stopped and
//! detached by its guard, also on panic.

use crate::common;
use crate::fs_support;

use std::path::Path;
use std::time::{Duration, Instant};

use fs_support::FsMount;
use remem::launcher::UnixSockets;

/// Mounts at `mountpoint` listed in /proc/self/mountinfo.
fn mounts_at(mountpoint: &Path) -> usize {
    let wanted = mountpoint.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter(|line| line.split(' ').nth(4) == Some(wanted.as_ref()))
        .count()
}

/// Sends `signal` to the mount's process and waits (up to 30 s) for it to exit; true if it did
/// with success.
fn signal_and_wait(mount: &mut FsMount, signal: libc::c_int) -> bool {
    // SAFETY: kill with the PID of a child we spawned and have not reaped.
    unsafe { libc::kill(mount.child.id() as libc::pid_t, signal) };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = mount.child.try_wait().expect("waiting for remem fs") {
            mount.reaped = true;
            return status.success();
        }
        assert!(Instant::now() < deadline, "remem fs did not exit on signal {signal}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A file open on the mount made the unmount fail with EBUSY, and `remem fs` exited leaving a
/// dead mount (`stat` of the mount point: ENOTCONN). Now the mount is detached lazily: the mount
/// point is a plain directory again, for SIGTERM and Ctrl-C alike.
#[test]
fn sigterm_or_sigint_with_a_file_open_leaves_no_dead_mount() {
    let dir = common::ScratchDir::new("fs-mounts-signal");
    let cluster = common::start_cluster("fs-mounts", "signal", 10, UnixSockets::None);
    let mountpoint = dir.join("mnt");
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut mount = FsMount::start(&cluster, &dir, "16MiB");
        std::fs::write(mount.path("held"), b"open while remem fs stops").expect("write");
        let held = std::fs::File::open(mount.path("held")).expect("open");
        assert_eq!(mounts_at(&mountpoint), 1, "mounted");
        assert!(signal_and_wait(&mut mount, signal), "remem fs exits cleanly: {}", mount.log_text());
        let listed = std::fs::read_dir(&mountpoint).map(|entries| entries.count());
        assert!(
            listed.as_ref().is_ok_and(|&count| count == 0),
            "signal {signal}: the mount point is left {listed:?}; log: {}",
            mount.log_text()
        );
        assert_eq!(mounts_at(&mountpoint), 0, "signal {signal}: still mounted; log: {}", mount.log_text());
        drop(held);
    }
}

/// A SIGKILLed `remem fs` leaves its mount dead; the next one on the same mount point detaches
/// it (saying so) and mounts, with the files of before.
#[test]
fn the_next_remem_fs_detaches_the_dead_mount_a_sigkilled_one_left() {
    let dir = common::ScratchDir::new("fs-mounts-dead");
    let cluster = common::start_cluster("fs-mounts", "dead", 10, UnixSockets::None);
    let mountpoint = dir.join("mnt");
    let mount = FsMount::start(&cluster, &dir, "16MiB");
    std::fs::write(mount.path("kept"), b"written before the SIGKILL").expect("write");
    mount.sigkill_leaving_a_dead_mount();
    let error = std::fs::read_dir(&mountpoint).expect_err("a dead mount");
    assert_eq!(error.raw_os_error(), Some(libc::ENOTCONN), "{error}");

    let mount = FsMount::start(&cluster, &dir, "16MiB");
    let log = mount.log_text();
    assert!(log.contains("dead mount") && log.contains("detached"), "remem fs says what it did: {log}");
    assert_eq!(mounts_at(&mountpoint), 1, "one mount, not one over a dead one");
    assert_eq!(std::fs::read(mount.path("kept")).expect("read"), b"written before the SIGKILL");
    mount.stop();
    assert_eq!(mounts_at(&mountpoint), 0, "unmounted");
}
