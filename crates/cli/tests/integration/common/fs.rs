//! A `remem fs` process and its mount for the tests that mount (fs.rs, fs_mounts.rs): started
//! on `DIR/mnt`, stopped and unmounted by a guard, also on panic (SIGTERM by PID, then
//! `fusermount3 -u -z`, then `umount -l`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use remem::launcher::LocalCluster;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// A `remem fs` process and its mount; unmounted and stopped on drop, whatever happened.
pub struct FsMount {
    pub child: Child,
    pub mountpoint: PathBuf,
    pub log: PathBuf,
    /// The child was killed and reaped: its PID must not be signalled again.
    pub reaped: bool,
    /// Drop leaves the mount point as it is (a dead mount the next `remem fs` must detach).
    pub leave_mount: bool,
}

/// The `remem fs` command line for a mount on `dir/mnt`.
pub fn fs_command(cluster: &LocalCluster, dir: &Path, size: &str, extra: &[&str]) -> Command {
    let mountpoint = dir.join("mnt");
    // A dead mount left there (a SIGKILLed `remem fs`) is a mount point already.
    match std::fs::create_dir_all(dir).and_then(|()| std::fs::create_dir(&mountpoint)) {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => panic!("mount point: {error}"),
        _ => {}
    }
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
    command.args(extra);
    command
}

/// Runs a `remem fs` command that must end by itself (refused), under a 30 s limit.
pub fn run_command(command: Command) -> std::process::Output {
    let mut timed = Command::new("timeout");
    timed.args(["-k", "5", "30"]).arg(command.get_program()).args(command.get_args());
    timed.stdin(Stdio::null()).output().expect("run remem fs")
}

impl FsMount {
    pub fn start(cluster: &LocalCluster, dir: &Path, size: &str) -> FsMount {
        FsMount::start_with(cluster, dir, size, &[])
    }

    pub fn start_with(cluster: &LocalCluster, dir: &Path, size: &str, extra: &[&str]) -> FsMount {
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: these tests need FUSE (modprobe fuse, or pass the device into the container)"
        );
        FsMount::start_command(fs_command(cluster, dir, size, extra), dir)
    }

    /// Runs `command`, a `remem fs` on `dir/mnt`, its log in `dir/fs.log`, until it mounts.
    pub fn start_command(command: Command, dir: &Path) -> FsMount {
        assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing: these tests need FUSE");
        let mountpoint = dir.join("mnt");
        let log = dir.join("fs.log");
        let (child, line) = crate::common::spawn_with_first_line(command, &log);
        let mount = FsMount { child, mountpoint, log, reaped: false, leave_mount: false };
        assert!(
            line.starts_with("mounted "),
            "remem fs did not mount: {line:?}; log: {}",
            std::fs::read_to_string(&mount.log).unwrap_or_default()
        );
        mount
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.mountpoint.join(name)
    }

    /// What `remem fs` wrote to stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM (a clean unmount) and wait for the process to end.
    pub fn stop(mut self) {
        self.stop_in_place();
    }

    pub fn stop_in_place(&mut self) {
        if self.reaped {
            return;
        }
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
        self.reaped = true;
    }

    /// SIGKILL: the process dies at once, its mount is left dead (detached by drop).
    pub fn sigkill(mut self) {
        self.child.kill().expect("SIGKILL remem fs");
        let _ = self.child.wait();
        self.reaped = true;
    }

    /// SIGKILL, and the dead mount stays for the next `remem fs` on the mount point to find (its
    /// guard detaches what is left).
    pub fn sigkill_leaving_a_dead_mount(mut self) {
        self.leave_mount = true;
        self.sigkill();
    }
}

impl Drop for FsMount {
    fn drop(&mut self) {
        self.stop_in_place();
        if self.leave_mount {
            return;
        }
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

/// Detaches a dead FUSE mount (its daemon was SIGKILLed): `fusermount3 -u -z`, else `umount -l`.
pub fn detach(mountpoint: &Path) {
    let fusermount =
        Command::new("fusermount3").arg("-u").arg("-z").arg(mountpoint).stderr(Stdio::null()).status();
    if !fusermount.is_ok_and(|status| status.success()) {
        let _ = Command::new("umount").arg("-l").arg(mountpoint).stderr(Stdio::null()).status();
    }
}
