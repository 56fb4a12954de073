//! POSIX conformance of `remem fs` through a real mount: pjdfstest (FreeBSD's and Linux's file
//! system conformance suite, 8,798 subtests, all of which pass on tmpfs) with no failure
//! allowed; an `open` racing a `rename` over its target never fails with `ENOENT` (the kernel
//! holds inodes it looked up until it forgets them); and the permission rules the kernel
//! enforces (`default_permissions`) on the attributes `remem fs` keeps, checked as another user.
//!
//! Needs root (pjdfstest switches users; the mount allows other users), FUSE, and what builds
//! and runs pjdfstest: autoconf, automake, make, gcc and perl's `prove` (scripts/setup.sh
//! installs them). pjdfstest itself is not in the repository: it is built from
//! `../shared/suites/pjdfstest` (beside the project's root) in a scratch copy under /tmp.
//! Every command runs under `timeout`; the mount is unmounted by its guard, also on panic.

use crate::common;
use crate::fs_support::FsMount;
use crate::kv_support::require_program;

use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use remem::launcher::{LocalCluster, UnixSockets};

/// pjdfstest files run at once: its tests sleep (to see times change) far more than they
/// compute, so files side by side take a fraction of the time one at a time does.
const PJDFSTEST_JOBS: &str = "8";
/// Bound of one group's run.
const PJDFSTEST_SECONDS: u32 = 300;
/// pjdfstest's test files in groups of one test each, so that each test stays within the
/// test runner's bound (two minutes): one at a time the whole suite takes about 5 minutes,
/// at 8 files at once about 2.5 on a busy machine. chown/00.t alone takes 85-95 s (84 of them
/// sleeping one second at a time, to see ctime change), so it runs by itself. An entry is a
/// directory of tests/ or one file; a file named by itself belongs to that group, not to its
/// directory's. Every file of the suite is in a group (checked).
const PJDFSTEST_GROUPS: [&[&str]; 5] = [
    &["chown/00.t"],
    &["rename", "chflags", "granular", "posix_fallocate"],
    &["link", "symlink", "rmdir", "mkdir", "mkfifo", "utimensat"],
    &["chmod", "open", "truncate"],
    &["chown", "unlink", "ftruncate", "mknod"],
];

fn assert_root(what: &str) {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "{what} needs root (CI runs as root)");
}

/// A cluster of ten nodes and a mount other users may enter (`--allow-other`).
/// (directory, cluster, mount): bound in this order, they drop mount first, directory last.
fn setup(name: &str) -> (common::ScratchDir, LocalCluster, FsMount) {
    let dir = common::ScratchDir::new(&format!("fs-posix-{name}"));
    let cluster = common::start_cluster("fs-posix", name, 10, UnixSockets::None);
    let mount = FsMount::start_with(&cluster, &dir, "64MiB", &["--allow-other"]);
    (dir, cluster, mount)
}

/// Runs `program` under `timeout -k 5 SECONDS` in `cwd`, stdin closed.
fn run_in(seconds: u32, cwd: &Path, program: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["-k", "5", &seconds.to_string(), program])
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("cannot run {program}: {error} (run scripts/setup.sh)"))
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A fingerprint of the pjdfstest source tree: every file's path, size and modification time.
fn source_fingerprint(source: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut entries = Vec::new();
    let mut pending = vec![source.to_path_buf()];
    while let Some(directory) = pending.pop() {
        for entry in std::fs::read_dir(&directory).expect("pjdfstest's source").filter_map(Result::ok) {
            let metadata = entry.metadata().expect("metadata of a pjdfstest file");
            if metadata.is_dir() {
                pending.push(entry.path());
            } else {
                entries.push((entry.path(), metadata.len(), metadata.modified().ok()));
            }
        }
    }
    entries.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    entries.hash(&mut hasher);
    hasher.finish()
}

/// Builds pjdfstest once for all of its groups: the five tests run in separate processes, and
/// building it (autoreconf, configure, make: 7 s of CPU, 15 s on a busy machine) took a sixth of
/// each group's time. The copy is built under the target directory's scratch space, keyed by a
/// fingerprint of the source, under an exclusive lock so that two groups starting together build
/// it once; the tests only read it (its `tests/` is what `prove` runs, its `pjdfstest` binary
/// what the tests call, each in the mount it is run from). Copies of other sources are removed.
fn build_pjdfstest() -> PathBuf {
    use std::os::fd::AsRawFd;
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/suites/pjdfstest");
    assert!(
        source.join("configure.ac").is_file(),
        "pjdfstest is missing at {}: the shared suites (../shared/suites beside the project) hold it",
        source.display()
    );
    for (program, package) in [
        ("autoreconf", "autoconf"),
        ("automake", "automake"),
        ("make", "make"),
        ("gcc", "gcc"),
        ("prove", "perl"),
    ] {
        require_program(program, package);
    }
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(scratch).expect("the target's scratch directory");
    let lock = std::fs::File::create(scratch.join("pjdfstest.lock")).expect("pjdfstest's build lock");
    // SAFETY: flock on a descriptor this function owns; the lock goes when `lock` is closed.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0, "locking pjdfstest's build");
    let name = format!("pjdfstest-{:016x}", source_fingerprint(&source));
    let copy = scratch.join(&name);
    let built = copy.join("built-by-fs_posix");
    if built.is_file() {
        return copy;
    }
    for entry in std::fs::read_dir(scratch).expect("the target's scratch directory").filter_map(Result::ok) {
        if entry.file_name().to_string_lossy().starts_with("pjdfstest-") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let output = run_in(60, scratch, "cp", &["-r", &source.to_string_lossy(), &copy.to_string_lossy()]);
    assert!(output.status.success(), "copying pjdfstest: {}", text(&output));
    for (program, args) in
        [("autoreconf", &["-ifs"][..]), ("./configure", &[][..]), ("make", &["pjdfstest"][..])]
    {
        let output = run_in(180, &copy, program, args);
        assert!(output.status.success(), "building pjdfstest: {program} {args:?} failed:\n{}", text(&output));
    }
    assert!(copy.join("pjdfstest").is_file(), "make pjdfstest built no pjdfstest binary");
    std::fs::write(&built, b"").expect("marking pjdfstest built");
    copy
}

/// `prove`'s summary: (test files, subtests), from `Files=N, Tests=M, ...`.
fn prove_counts(output: &str) -> Option<(u64, u64)> {
    let line = output.lines().find(|line| line.starts_with("Files="))?;
    let mut numbers = line.split(',').take(2).map(|part| part.split('=').nth(1)?.trim().parse().ok());
    Some((numbers.next()??, numbers.next()??))
}

/// Every test file of pjdfstest (`DIR/NAME.t`, relative to tests/) with its group's index.
fn pjdfstest_files_by_group(tests: &Path) -> Vec<(String, usize)> {
    let mut files = Vec::new();
    for directory in std::fs::read_dir(tests).expect("pjdfstest's tests").filter_map(Result::ok) {
        if !directory.path().is_dir() {
            continue;
        }
        let directory_name = directory.file_name().to_string_lossy().into_owned();
        for file in std::fs::read_dir(directory.path()).expect("a pjdfstest directory").filter_map(Result::ok)
        {
            let file_name = file.file_name().to_string_lossy().into_owned();
            if !file_name.ends_with(".t") {
                continue;
            }
            let path = format!("{directory_name}/{file_name}");
            let named = |entry: &str| entry == path;
            let in_directory = |entry: &str| entry == directory_name;
            let group = PJDFSTEST_GROUPS
                .iter()
                .position(|group| group.iter().any(|entry| named(entry)))
                .or_else(|| {
                    PJDFSTEST_GROUPS.iter().position(|group| group.iter().any(|entry| in_directory(entry)))
                })
                .unwrap_or_else(|| panic!("pjdfstest's {path} is in no group of PJDFSTEST_GROUPS: add it"));
            files.push((path, group));
        }
    }
    files.sort();
    files
}

/// Runs pjdfstest's files of group `index` from inside a fresh mount and asserts that every
/// subtest passes (tmpfs passes them all) and every file of the group ran.
fn pjdfstest_group_passes(index: usize) {
    assert_root("pjdfstest");
    let (_dir, _cluster, mount) = setup(&format!("pjdfstest-{index}"));
    let pjdfstest = build_pjdfstest();
    let tests = pjdfstest.join("tests");
    let all = pjdfstest_files_by_group(&tests);
    assert!(all.len() >= 200, "pjdfstest has only {} test files", all.len());
    let files: Vec<String> = all
        .iter()
        .filter(|(_, group)| *group == index)
        .map(|(path, _)| tests.join(path).to_string_lossy().into_owned())
        .collect();
    let started = Instant::now();
    let mut args = vec!["-j", PJDFSTEST_JOBS];
    args.extend(files.iter().map(String::as_str));
    let output = run_in(PJDFSTEST_SECONDS, &mount.mountpoint, "prove", &args);
    let report = text(&output);
    let took = started.elapsed();
    let group = PJDFSTEST_GROUPS[index];
    eprintln!("pjdfstest {group:?} ({} files) on remem fs took {:.0} s", files.len(), took.as_secs_f64());
    let failures: Vec<&str> =
        report.lines().filter(|line| line.contains("Wstat") || line.contains("Failed tests")).collect();
    assert!(
        output.status.success() && report.contains("Result: PASS") && failures.is_empty(),
        "pjdfstest {group:?} failed on remem fs after {took:?} ({}):\n{}\n\nfull report:\n{report}\n\nremem fs log:\n{}",
        output.status,
        failures.join("\n"),
        mount.log_text()
    );
    let (ran, subtests) = prove_counts(&report).expect("prove's summary line");
    assert_eq!(ran, files.len() as u64, "prove ran {ran} of the group's {} test files", files.len());
    assert!(subtests >= ran, "pjdfstest {group:?} ran only {subtests} subtests");
}

#[test]
fn pjdfstest_chown_00_passes_every_subtest_as_on_tmpfs() {
    pjdfstest_group_passes(0);
}

#[test]
fn pjdfstest_rename_chflags_granular_posix_fallocate_pass_every_subtest_as_on_tmpfs() {
    pjdfstest_group_passes(1);
}

#[test]
fn pjdfstest_link_symlink_rmdir_mkdir_mkfifo_utimensat_pass_every_subtest_as_on_tmpfs() {
    pjdfstest_group_passes(2);
}

#[test]
fn pjdfstest_chmod_open_truncate_pass_every_subtest_as_on_tmpfs() {
    pjdfstest_group_passes(3);
}

#[test]
fn pjdfstest_chown_unlink_ftruncate_mknod_pass_every_subtest_as_on_tmpfs() {
    pjdfstest_group_passes(4);
}

/// Renames a fresh file over `target` `renames` times while another thread opens and reads
/// `target` as fast as it can; returns the reader's opens and how many failed with ENOENT.
fn rename_over_while_opening(directory: &Path, renames: usize) -> (u64, u64, Vec<String>) {
    let target = directory.join("target");
    std::fs::write(&target, b"generation 0").expect("first target");
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (done, target) = (Arc::clone(&done), target.clone());
        std::thread::spawn(move || {
            let (mut opens, mut missing, mut other) = (0u64, 0u64, Vec::new());
            let mut buffer = Vec::new();
            while !done.load(Ordering::Relaxed) {
                opens += 1;
                match std::fs::File::open(&target) {
                    Ok(mut file) => {
                        buffer.clear();
                        if let Err(error) = file.read_to_end(&mut buffer) {
                            other.push(format!("read: {error}"));
                        } else if !buffer.starts_with(b"generation ") {
                            other.push(format!("read {:?}", String::from_utf8_lossy(&buffer)));
                        }
                    }
                    Err(error) if error.kind() == ErrorKind::NotFound => missing += 1,
                    Err(error) => other.push(format!("open: {error}")),
                }
            }
            (opens, missing, other)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    for generation in 1..=renames {
        let temporary = directory.join("tmp");
        let mut file = std::fs::File::create(&temporary).expect("create tmp");
        file.write_all(format!("generation {generation}").as_bytes()).expect("write tmp");
        drop(file);
        std::fs::rename(&temporary, &target).expect("rename tmp over target");
        assert!(Instant::now() < deadline, "{generation} renames took over 120 s");
    }
    done.store(true, Ordering::Relaxed);
    reader.join().expect("reader thread")
}

#[test]
fn open_racing_rename_over_its_target_never_fails_with_enoent() {
    let (_dir, _cluster, mount) = setup("rename-race");
    let (opens, missing, other) = rename_over_while_opening(&mount.mountpoint, 2000);
    assert!(opens > 100, "the reader opened only {opens} times: no race was tried");
    assert_eq!(missing, 0, "{missing} of {opens} opens of the target failed with ENOENT (tmpfs: none)");
    assert!(other.is_empty(), "other failures: {:?}", &other[..other.len().min(5)]);
}

/// Runs `script` with `sh -c` as uid and gid 65534 (nobody), no supplementary groups.
fn as_nobody(cwd: &Path, script: &str) -> Output {
    run_in(30, cwd, "setpriv", &["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script])
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

#[test]
fn permission_rules_hold_for_another_user_on_the_attributes_remem_fs_keeps() {
    assert_root("switching to another user");
    require_program("setpriv", "util-linux");
    let (_dir, _cluster, mount) = setup("permissions");
    let root = &mount.mountpoint;
    let shared = root.join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).expect("sticky");
    let private = shared.join("private");
    std::fs::write(&private, b"secret").expect("root's file");
    std::fs::set_permissions(&private, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    // Owner/group/other bits: nobody may not read root's 0600 file, nor chmod it.
    let output = as_nobody(&shared, "cat private");
    assert!(!output.status.success() && text(&output).contains("Permission denied"), "{}", text(&output));
    let output = as_nobody(&shared, "chmod 666 private");
    assert!(!output.status.success(), "nobody changed the mode of root's file");
    // Sticky directory: nobody may not remove or rename root's file in it, but its own.
    let output = as_nobody(&shared, "rm -f private || mv private elsewhere");
    assert!(!output.status.success() && private.exists(), "{}", text(&output));
    let output = as_nobody(&shared, "echo mine > own && mv own own2 && rm own2");
    assert!(output.status.success(), "{}", text(&output));
    // Set-ID bits go when someone without the capability writes the file, or it changes owner.
    let set_id = shared.join("set-id");
    std::fs::write(&set_id, b"").expect("create");
    std::fs::set_permissions(&set_id, std::os::unix::fs::PermissionsExt::from_mode(0o6777)).expect("chmod");
    let output = as_nobody(&shared, "echo appended >> set-id");
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(mode_of(&set_id), 0o777, "a write by another user clears set-user-ID and set-group-ID");
    std::fs::set_permissions(&set_id, std::os::unix::fs::PermissionsExt::from_mode(0o6755)).expect("chmod");
    std::os::unix::fs::chown(&set_id, Some(65534), None).expect("chown");
    assert_eq!(mode_of(&set_id), 0o755, "chown clears set-user-ID and set-group-ID");
    // A set-group-ID directory: new nodes take its group, subdirectories its bit too.
    let group_dir = root.join("group");
    std::fs::create_dir(&group_dir).expect("mkdir");
    std::os::unix::fs::chown(&group_dir, None, Some(65534)).expect("chgrp");
    std::fs::set_permissions(&group_dir, std::os::unix::fs::PermissionsExt::from_mode(0o2775)).expect("g+s");
    std::fs::write(group_dir.join("file"), b"").expect("create");
    std::fs::create_dir(group_dir.join("sub")).expect("mkdir");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(group_dir.join("file")).expect("stat").gid(), 65534);
    assert_eq!(std::fs::metadata(group_dir.join("sub")).expect("stat").gid(), 65534);
    assert_eq!(mode_of(&group_dir.join("sub")) & 0o2000, 0o2000, "a subdirectory is set-group-ID too");
}
