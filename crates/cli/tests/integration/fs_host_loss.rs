//! `remem fs` surviving the loss of its host (issue 27 items 1, 2 and 4; docs/FS.md "Host
//! loss"): the metadata in remote memory (`--metadata remote`) and the slab maps in etcd
//! (`--etcd`), so that a `remem fs` with nothing local from the one that died mounts the same
//! file system with every fsynced file byte-exact. Real FUSE mounts on real node processes and a
//! real etcd; every process is stopped by PID and every mount detached by its guard.

use crate::common;
use crate::etcd_support;
use crate::fs_support;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use etcd_support::{wait_for, write_secret, EtcdNode, EtcdServer};
use fs_support::FsMount;
use remem::launcher::UnixSockets;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// What a tree holds: directories, files (contents and mode), symlinks.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tree {
    pub directories: Vec<String>,
    pub files: BTreeMap<String, (Vec<u8>, u32)>,
    pub symlinks: BTreeMap<String, String>,
}

fn contents(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|at| ((at * 31 + seed * 7919) % 251) as u8).collect()
}

/// Writes a tree of directories, files from empty to 300 KiB (sparse ones too), symlinks, a hard
/// link and a rename under `root`, fsyncing every file and directory; returns what it holds.
pub fn write_tree(root: &Path, files: usize) -> Tree {
    let mut tree = Tree::default();
    for directory in ["a", "a/b", "c"] {
        std::fs::create_dir(root.join(directory)).expect("mkdir");
        tree.directories.push(directory.to_owned());
    }
    for index in 0..files {
        let name = format!("{}/file-{index:03}", ["a", "a/b", "c"][index % 3]);
        let len = [0, 1, 4095, 4096, 4097, 65_536, 300_000][index % 7] + index;
        let mut bytes = contents(index, len);
        let path = root.join(&name);
        let mut file = std::fs::File::create(&path).expect("create");
        if index % 5 == 4 {
            // Sparse: a hole before the bytes.
            file.set_len(1 << 20).expect("extend");
            std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(1 << 20)).expect("seek");
            let mut whole = vec![0; 1 << 20];
            whole.extend_from_slice(&bytes);
            bytes = whole;
            file.write_all(&contents(index, len)).expect("write");
        } else {
            file.write_all(&bytes).expect("write");
        }
        let mode = [0o644, 0o600, 0o755][index % 3];
        file.set_permissions(std::fs::Permissions::from_mode(mode)).expect("chmod");
        file.sync_all().expect("fsync");
        tree.files.insert(name, (bytes, mode));
    }
    std::os::unix::fs::symlink("../a/file-000", root.join("c/link")).expect("symlink");
    tree.symlinks.insert("c/link".into(), "../a/file-000".into());
    std::fs::hard_link(root.join("a/file-003"), root.join("c/hard")).expect("hard link");
    let linked = tree.files["a/file-003"].clone();
    tree.files.insert("c/hard".into(), linked);
    std::fs::rename(root.join("c/file-002"), root.join("a/b/renamed")).expect("rename");
    let moved = tree.files.remove("c/file-002").expect("c/file-002");
    tree.files.insert("a/b/renamed".into(), moved);
    for directory in ["", "a", "a/b", "c"] {
        std::fs::File::open(root.join(directory)).and_then(|handle| handle.sync_all()).expect("fsync dir");
    }
    tree
}

/// Reads the tree under `root` back.
pub fn read_tree(root: &Path) -> Tree {
    let mut tree = Tree::default();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(root.join(&relative))
            .expect("readdir")
            .map(|entry| entry.expect("entry"))
            .collect();
        entries.sort_by_key(|entry| entry.file_name());
        for entry in entries {
            let name = relative.join(entry.file_name());
            let key = name.to_string_lossy().into_owned();
            let kind = entry.file_type().expect("type");
            if kind.is_dir() {
                tree.directories.push(key);
                pending.push(name);
            } else if kind.is_symlink() {
                let target = std::fs::read_link(entry.path()).expect("readlink");
                tree.symlinks.insert(key, target.to_string_lossy().into_owned());
            } else {
                let mode = entry.metadata().expect("stat").permissions().mode() & 0o7777;
                tree.files.insert(key, (std::fs::read(entry.path()).expect("read"), mode));
            }
        }
    }
    tree.directories.sort();
    tree
}

/// Compares two trees, naming the first difference rather than printing megabytes.
pub fn assert_same_tree(found: &Tree, expected: &Tree) {
    let mut wanted_directories = expected.directories.clone();
    wanted_directories.sort();
    assert_eq!(found.directories, wanted_directories, "directories");
    assert_eq!(found.symlinks, expected.symlinks, "symlinks");
    let names = |tree: &Tree| tree.files.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(found), names(expected), "file names");
    for (name, (bytes, mode)) in &expected.files {
        let (found_bytes, found_mode) = &found.files[name];
        assert_eq!(found_mode, mode, "{name}: mode");
        if found_bytes != bytes {
            let at = found_bytes.iter().zip(bytes).position(|(a, b)| a != b);
            panic!(
                "{name}: {} bytes found, {} expected, first difference at {at:?}",
                found_bytes.len(),
                bytes.len()
            );
        }
    }
}

#[test]
fn remote_metadata_survives_a_sigkill_and_two_dead_nodes_with_no_snapshot_or_journal_on_the_host() {
    remote_metadata_round("reply");
}

#[test]
fn remote_metadata_written_at_syncs_only_keeps_every_fsynced_file_across_a_sigkill() {
    remote_metadata_round("fsync");
}

/// Files written and fsynced with `--metadata remote --metadata-sync SYNC`, `remem fs`
/// SIGKILLed, two nodes of ten SIGKILLed, mounted again from the slab maps alone.
fn remote_metadata_round(sync: &str) {
    let dir = common::ScratchDir::new(&format!("fs-remote-metadata-{sync}"));
    let mut cluster = common::start_cluster("fs", &format!("remote-metadata-{sync}"), 10, UnixSockets::None);
    let state = dir.join("state");
    let state_arg = state.to_str().expect("utf-8").to_owned();
    let args =
        ["--state", &state_arg, "--metadata", "remote", "--metadata-size", "8MiB", "--metadata-sync", sync];
    let mount = FsMount::start_with(&cluster, &dir, "32MiB", &args);
    let started = Instant::now();
    let tree = write_tree(&mount.mountpoint, 30);
    eprintln!(
        "wrote {} files with remote metadata in {:.2} s",
        tree.files.len(),
        started.elapsed().as_secs_f64()
    );
    mount.sigkill();
    let mut local: Vec<String> = std::fs::read_dir(&state)
        .expect("state directory")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    local.sort();
    assert_eq!(local, ["lock", "metamap.json", "slabmap.json"], "only the lock and the slab maps are local");

    // Two nodes of ten die: every range, contents and metadata alike, keeps k of its k+r.
    cluster.kill(2).expect("SIGKILL node 2");
    cluster.kill(6).expect("SIGKILL node 6");
    let mount = FsMount::start_with(&cluster, &dir, "32MiB", &args);
    assert!(mount.log_text().contains("from remote memory"), "{}", mount.log_text());
    assert_same_tree(&read_tree(&mount.mountpoint), &tree);

    // Local metadata asked of it is refused, naming the flag.
    mount.stop();
    let output =
        fs_support::run_command(fs_support::fs_command(&cluster, &dir, "32MiB", &["--state", &state_arg]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--metadata remote"), "{stderr}");
}

/// etcd, ten nodes registered in it and the secret.
fn etcd_cluster(dir: &Path) -> (EtcdServer, PathBuf, Vec<EtcdNode>) {
    etcd_support::start_registered(dir, 10, ("24MiB", "1MiB"))
}

/// `remem fs --etcd` on `home/mnt`, its state directory in `home`: nothing local is shared
/// between two homes.
fn etcd_fs_command(etcd: &EtcdServer, secret: &Path, home: &Path) -> Command {
    let mountpoint = home.join("mnt");
    match std::fs::create_dir_all(&mountpoint) {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => panic!("mount point: {error}"),
        _ => {}
    }
    let mut command = Command::new(binary());
    command.arg("fs").arg(&mountpoint).args(["--etcd", &etcd.url, "--secret-file"]).arg(secret);
    command.args(["--name", "shared", "--size", "32MiB", "-k", "8", "-r", "2", "--metadata-size", "8MiB"]);
    command.arg("--state").arg(home.join("state")).args(["--request-timeout-ms", "1000"]);
    // A dead holder's name is free after 3 s, not 10 (the waits below are this long).
    command.args(["--etcd-lease-seconds", "3"]);
    command
}

#[test]
fn an_etcd_file_system_mounts_in_another_home_with_every_fsynced_file_and_a_second_owner_is_refused() {
    let dir = common::ScratchDir::new("fs-etcd-host-loss");
    let (etcd, secret, _nodes) = etcd_cluster(&dir);
    let home_a = dir.join("host-a");
    let mount = FsMount::start_command(etcd_fs_command(&etcd, &secret, &home_a), &home_a);
    let tree = write_tree(&mount.mountpoint, 24);
    let keys = etcd.keys("/remem/clients/");
    for key in ["/remem/clients/shared/slabmap", "/remem/clients/shared.meta/slabmap"] {
        assert!(keys.iter().any(|found| found == key), "{key} not in {keys:?}");
    }

    // While A lives, a second process on the name waits one lease, then is refused.
    let home_b = dir.join("host-b");
    let output = fs_support::run_command(etcd_fs_command(&etcd, &secret, &home_b));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("held"), "{stderr}");

    // A dies with its host: SIGKILL, and its state directory gone with it.
    mount.sigkill();
    std::fs::remove_dir_all(home_a.join("state")).expect("remove A's state");
    let started = Instant::now();
    let home_c = dir.join("host-c");
    let mount = FsMount::start_command(etcd_fs_command(&etcd, &secret, &home_c), &home_c);
    eprintln!("host C mounted {:.1} s after host A died", started.elapsed().as_secs_f64());
    assert!(mount.log_text().contains("from remote memory"), "{}", mount.log_text());
    assert_same_tree(&read_tree(&mount.mountpoint), &tree);
    // Stopped (SIGSTOP) for longer than its etcd lease and the nodes' lease while nobody else
    // claims the name: when it runs again it claims the name again rather than serve without
    // owning it, is not fenced, and once its client is back at the nodes (which closed every
    // connection of the stopped process: its slabs, which missed no write, are its ranges'
    // again with no rebuild) it writes again. A change made then is there at the next mount.
    // SAFETY: kill with the PID of a child we spawned and have not reaped.
    unsafe { libc::kill(mount.child.id() as libc::pid_t, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_secs(12));
    // SAFETY: as above.
    unsafe { libc::kill(mount.child.id() as libc::pid_t, libc::SIGCONT) };
    let claimed =
        wait_for(Duration::from_secs(20), || mount.log_text().matches("claimed again").count() == 2);
    assert!(claimed, "the lapsed leases were not claimed again: {}", mount.log_text());
    let written = wait_for(Duration::from_secs(15), || {
        std::fs::write(mount.path("after"), b"written on host C").is_ok()
    });
    assert!(written, "writes fail on C after it resumed: {}", mount.log_text());
    assert!(!mount.log_text().contains("fenced"), "{}", mount.log_text());
    mount.stop();
    let mount = FsMount::start_command(etcd_fs_command(&etcd, &secret, &home_c), &home_c);
    assert_eq!(std::fs::read(mount.path("after")).expect("read"), b"written on host C");
    mount.stop();
    let mut fresh = etcd_fs_command(&etcd, &secret, &home_c);
    fresh.arg("--fresh");
    let mount = FsMount::start_command(fresh, &home_c);
    assert_eq!(std::fs::read_dir(&mount.mountpoint).expect("readdir").count(), 0, "--fresh starts empty");
}

/// The bar of issue 27 for `remem fs`, across "hosts" (network namespaces on a bridge, as
/// netns_etcd.rs): etcd on its own host, five node hosts of two nodes each, `remem fs --etcd` on
/// host A. Files are written and fsynced there; then host A is lost at once (its `remem fs`
/// SIGKILLed and its link cut: it can neither serve nor renew its lease), and host C, another
/// address with nothing of A's, mounts the file system: every file byte-exact.
#[test]
fn a_file_system_on_a_lost_host_mounts_on_another_host_with_every_fsynced_file() {
    use crate::netns_support as netns;
    const NODE_HOSTS: usize = 5;
    const HOST_A: usize = NODE_HOSTS;
    const HOST_C: usize = NODE_HOSTS + 1;
    const ETCD_HOST: usize = NODE_HOSTS + 2;
    let net = netns::Net::new(NODE_HOSTS + 3, &[]);
    let dir = common::ScratchDir::new("fs-netns-host-loss");
    let secret = write_secret(&dir);
    let url = netns::start_etcd(&net, ETCD_HOST, &dir);
    // A host cut off alive loses its sessions at the nodes in 3 s, as its etcd lease.
    let sizes = ("24MiB", "1MiB");
    let lease = ["--lease-timeout", "3s"];
    netns::start_etcd_nodes(&net, (ETCD_HOST, &url), NODE_HOSTS, &[7100, 7101], sizes, &secret, &lease, &dir);
    let command = |home: &Path| {
        let mut command = Command::new(binary());
        std::fs::create_dir_all(home.join("mnt")).expect("mount point");
        command.arg("fs").arg(home.join("mnt")).args(["--etcd", &url, "--secret-file"]).arg(&secret);
        command.args(["--name", "lost", "--size", "32MiB", "-k", "4", "-r", "2", "--metadata-size", "4MiB"]);
        command.arg("--state").arg(home.join("state")).args(["--request-timeout-ms", "1000"]);
        command.args(["--etcd-lease-seconds", "3"]);
        command
    };

    let home_a = dir.join("host-a");
    let mount = net.run_in(HOST_A, || FsMount::start_command(command(&home_a), &home_a));
    let tree = write_tree(&mount.mountpoint, 24);
    let lost_at = Instant::now();
    mount.sigkill();
    net.partition(HOST_A);

    let home_c = dir.join("host-c");
    let mount = net.run_in(HOST_C, || FsMount::start_command(command(&home_c), &home_c));
    eprintln!(
        "host C mounted the file system {:.1} s after host A was lost (one etcd lease, 3 s, at most)",
        lost_at.elapsed().as_secs_f64()
    );
    assert_same_tree(&read_tree(&mount.mountpoint), &tree);

    // Now host C is cut off but keeps running, and the file system is mounted again on host A
    // (back, with a new home) once C's leases lapse. When C's link comes back it finds itself
    // fenced (etcd gave its name to A; the nodes refuse its session): it writes nothing more,
    // unmounts and exits with an error.
    let mut mount_c = mount;
    std::fs::write(mount_c.path("from-c"), b"written on host C").expect("write on C");
    std::fs::File::open(mount_c.path("from-c")).and_then(|file| file.sync_all()).expect("fsync on C");
    net.heal(HOST_A);
    net.partition(HOST_C);
    let cut_at = Instant::now();
    let home_a2 = dir.join("host-a-again");
    let mount_a = net.run_in(HOST_A, || FsMount::start_command(command(&home_a2), &home_a2));
    eprintln!("host A mounted it again {:.1} s after host C was cut off", cut_at.elapsed().as_secs_f64());
    assert_eq!(std::fs::read(mount_a.path("from-c")).expect("read on A"), b"written on host C");
    net.heal(HOST_C);
    let exited = wait_for(Duration::from_secs(30), || matches!(mount_c.child.try_wait(), Ok(Some(_))));
    assert!(exited, "host C's remem fs still runs after it was fenced");
    mount_c.reaped = true;
    let status = mount_c.child.wait().expect("status");
    let log = mount_c.log_text();
    assert!(!status.success() && log.contains("fenced"), "{status}: {log}");
    let mut expected = tree;
    expected.files.insert("from-c".into(), (b"written on host C".to_vec(), 0o644));
    assert_same_tree(&read_tree(&mount_a.mountpoint), &expected);
    drop((mount_c, mount_a));
    let exited = net.exited();
    assert!(exited.is_empty(), "node or etcd processes exited: {exited:?}; logs in {}", dir.display());
}
