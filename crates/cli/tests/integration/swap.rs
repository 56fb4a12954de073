//! `remem swap on` / `off` for real: a swap area on a loop device over a `remem fs` file, used
//! by a process in a memory cgroup limited below its footprint, whose data must come back
//! intact; then `off` must leave no swap area, loop device, daemon or mount, also after the
//! daemon was SIGKILLed. Needs root, FUSE, loop devices and a memory cgroup (v1 or v2): it
//! fails with the reason when one is missing. `remem swap off` runs in a guard, also on panic.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use remem::launcher::UnixSockets;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

fn remem(args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["-k", "5", "90"])
        .arg(binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("remem runs")
}

/// Runs `remem swap off` on drop, whatever happened.
struct SwapGuard {
    runtime_dir: PathBuf,
}

impl Drop for SwapGuard {
    fn drop(&mut self) {
        let output = remem(&["swap", "off", "--runtime-dir", self.runtime_dir.to_str().expect("utf-8")]);
        if !output.status.success() {
            eprintln!("swap off in the guard: {}", String::from_utf8_lossy(&output.stderr));
        }
    }
}

/// A memory cgroup (v1, else v2) limited to `limit_bytes`; removed on drop.
struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    fn create(name: &str, limit_bytes: u64) -> MemoryCgroup {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(name), "memory.limit_in_bytes")
        } else {
            let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .into_iter()
                .map(Path::new)
                .find(|root| {
                    std::fs::read_to_string(root.join("cgroup.controllers"))
                        .unwrap_or_default()
                        .contains("memory")
                })
                .expect(
                    "this test needs a memory cgroup: no v1 hierarchy and no v2 with the memory controller",
                );
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
            (root.join(name), "memory.max")
        };
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|error| panic!("creating cgroup {}: {error}", dir.display()));
        std::fs::write(dir.join(limit_file), limit_bytes.to_string()).expect("setting the memory limit");
        MemoryCgroup { dir }
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn vmstat(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/vmstat").expect("/proc/vmstat");
    let line = text.lines().find(|line| line.starts_with(&format!("{field} "))).expect("field present");
    line.split_whitespace().nth(1).expect("value").parse().expect("number")
}

/// Nothing of remem swap under `runtime_dir` is attached: no swap area, loop device or mount.
fn assert_nothing_attached(runtime_dir: &Path) {
    let mountpoint = runtime_dir.join("mnt");
    let prefix = mountpoint.to_string_lossy().into_owned();
    let swaps = std::fs::read_to_string("/proc/swaps").expect("/proc/swaps");
    for entry in std::fs::read_dir("/sys/block").expect("/sys/block").flatten() {
        let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).unwrap_or_default();
        assert!(
            !backing.starts_with(&prefix),
            "loop device {:?} still attached to {backing}",
            entry.file_name()
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(&prefix), "still mounted: {prefix}");
    assert!(!runtime_dir.join("state.json").exists(), "state file left");
    assert!(!swaps.contains(&prefix), "swap left: {swaps}");
}

#[test]
fn swap_on_pages_a_limited_cgroup_to_remem_and_off_leaves_nothing_attached() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "remem swap needs root (CI runs as root)");
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing: remem swap needs FUSE");
    let started = Instant::now();
    // Over shared memory (the nodes' Unix sockets): the file system daemon's fastest path; the
    // swap of `remem run`'s tests goes over TCP.
    let cluster = common::start_cluster("swap", "on-off", 10, UnixSockets::All);
    let runtime_dir = std::env::temp_dir().join(format!("remem-swap-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&runtime_dir);
    let runtime_arg = runtime_dir.to_str().expect("utf-8").to_owned();
    let guard = SwapGuard { runtime_dir: runtime_dir.clone() };
    let cluster_arg = cluster.cluster_file_path.to_str().expect("utf-8");
    let on =
        ["swap", "on", "--size", "64MiB", "--priority", "7", "--transport", "shm", "--cluster", cluster_arg];
    let output = remem(&[&on[..], &["--runtime-dir", &runtime_arg]].concat());
    assert!(
        output.status.success(),
        "swap on failed: {}{}; daemon log: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_to_string(runtime_dir.join("fs.log")).unwrap_or_default()
    );
    let shown = String::from_utf8_lossy(
        &Command::new("swapon")
            .args(["--show=NAME,PRIO", "--noheadings"])
            .output()
            .expect("swapon --show")
            .stdout,
    )
    .into_owned();
    assert!(
        shown.lines().any(|line| line.contains("/dev/loop") && line.trim().ends_with(" 7")),
        "swapon --show: {shown}"
    );

    // 40 MiB of distinct blocks in a 24 MiB cgroup: at least 16 MiB must go to swap and come back.
    let swapped_out_before = vmstat("pswpout");
    let cgroup = MemoryCgroup::create(&format!("remem-swap-test-{}", std::process::id()), 24 << 20);
    let procs = cgroup.dir.join("cgroup.procs");
    let script = "blocks = [bytes([i % 251]) * 65536 for i in range(640)]\n\
                  assert all(b == bytes([i % 251]) * 65536 for i, b in enumerate(blocks)), 'wrong bytes'\n\
                  print('intact')";
    let hog = Command::new("timeout")
        .args(["-k", "5", "60", "sh", "-c", "echo $$ > \"$0\" && exec python3 -c \"$1\""])
        .arg(&procs)
        .arg(script)
        .stdin(Stdio::null())
        .output()
        .expect("python3 runs");
    assert!(
        hog.status.success() && String::from_utf8_lossy(&hog.stdout).contains("intact"),
        "the paging process failed: {}{}",
        String::from_utf8_lossy(&hog.stdout),
        String::from_utf8_lossy(&hog.stderr)
    );
    let swapped_out = vmstat("pswpout") - swapped_out_before;
    assert!(swapped_out >= 2048, "only {swapped_out} pages went to swap");
    drop(cgroup);

    let output = remem(&["swap", "off", "--runtime-dir", &runtime_arg]);
    assert!(output.status.success(), "swap off: {}", String::from_utf8_lossy(&output.stderr));
    assert_nothing_attached(&runtime_dir);

    // After a crash: the daemon SIGKILLed under an active swap area; `off` still cleans up.
    let output = remem(&[&on[..], &["--runtime-dir", &runtime_arg]].concat());
    assert!(output.status.success(), "swap on again: {}", String::from_utf8_lossy(&output.stderr));
    let state = std::fs::read_to_string(runtime_dir.join("state.json")).expect("state file");
    let state: serde_json::Value = serde_json::from_str(&state).expect("state is JSON");
    let pid = state["daemon_pid"].as_u64().expect("daemon pid") as libc::pid_t;
    // SAFETY: kill with the PID the state file names, a daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let output = remem(&["swap", "off", "--runtime-dir", &runtime_arg]);
    assert!(output.status.success(), "swap off after a crash: {}", String::from_utf8_lossy(&output.stderr));
    assert_nothing_attached(&runtime_dir);
    drop(guard);
    eprintln!("swap test took {:?}", started.elapsed());
}

/// A swap the cluster cannot hold fails with one error, printed once: the file system daemon's
/// own reason, not its log lines, and nothing attached after (before: the error twice, with the
/// daemon's raw log inside, and `remem swap off`'s report between them). `remem run
/// --swap-size` says it once too, and leaves no runtime directory.
#[test]
fn swap_on_larger_than_the_cluster_fails_with_one_error_and_nothing_attached() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "remem swap needs root (CI runs as root)");
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing: remem swap needs FUSE");
    let cluster = common::start_cluster("swap", "too-large", 3, UnixSockets::None);
    let cluster_arg = cluster.cluster_file_path.to_str().expect("utf-8");
    let runtime_dir =
        std::env::temp_dir().join(format!("remem-swap-runtime-too-large-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&runtime_dir);
    let _guard = SwapGuard { runtime_dir: runtime_dir.clone() };
    let runtime_arg = runtime_dir.to_str().expect("utf-8");
    let shape = ["-k", "2", "-r", "1", "--cluster", cluster_arg];
    let output =
        remem(&[&["swap", "on", "--size", "10TiB", "--runtime-dir", runtime_arg], &shape[..]].concat());
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!output.status.success());
    assert_eq!(stderr.lines().count(), 1, "one line of error: {stderr}");
    assert!(stderr.starts_with("error: swap on failed, and is undone"), "{stderr}");
    assert!(stderr.contains("remem fs did not mount: connecting to the cluster"), "{stderr}");
    assert!(!stderr.contains("error: error") && !stderr.contains("WARN"), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_nothing_attached(&runtime_dir);

    let run_dir = runtime_dir.with_extension("run");
    let run =
        [&["run", "--memory-limit", "24MiB", "--swap-size", "10TiB", "--swap-runtime-dir"][..]].concat();
    let output =
        remem(&[&run[..], &[run_dir.to_str().expect("utf-8")], &shape[..], &["--", "true"]].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert_eq!(stderr.lines().count(), 1, "one line of error: {stderr}");
    assert!(
        stderr.starts_with("error: remem swap on --size 10.00 TiB: swap on failed, and is undone"),
        "{stderr}"
    );
    assert!(!run_dir.exists(), "remem run left its swap runtime directory");
}
