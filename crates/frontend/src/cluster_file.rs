//! The files a command finds on this host: the runtime directory `remem up` writes to
//! ([`default_dir`]), the cluster file a front end is pointed at and its secret
//! ([`load_cluster`]), whether a saved slab map belongs to that cluster
//! ([`check_saved_on_cluster`]), and directories and files only this user may read
//! ([`private_directory`], [`write_private_file`]), where secrets, slab maps and reports go.
//!
//! Everything read here is input: a cluster file or secret that does not parse is an error
//! naming the file, never a panic.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use remem_client::cluster::ClusterFile;
use remem_client::Secret;

/// Where `remem up` puts its files unless told otherwise.
pub fn default_dir() -> PathBuf {
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(runtime).join("remem");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("remem-{uid}"))
}

/// Refuses a saved slab map none of whose nodes is in the cluster file (`saved` says what holds
/// it): it was saved on another cluster, typically before `remem up` started a new one in the
/// same directory, and reopening it could only fail on unreachable nodes.
pub fn check_saved_on_cluster(
    map: &remem_client::SlabMapFile,
    cluster: &ClusterFile,
    cluster_path: &Path,
    saved: &str,
) -> Result<()> {
    let ours = |address: &SocketAddr| cluster.nodes.iter().any(|node| node.address == *address);
    if !map.nodes.is_empty() && !map.nodes.iter().any(ours) {
        bail!(
            "{saved} was saved on another cluster: none of its {} nodes is in {} (a new `remem up` \
             in the same directory starts a new cluster, and its old slabs are gone); pass --fresh \
             to drop it and start empty, or --cluster of the cluster it was saved on",
            map.nodes.len(),
            cluster_path.display()
        );
    }
    Ok(())
}

/// The cluster file a front end was pointed at (or `remem up`'s default), and its secret.
///
/// Errors: the file or the secret cannot be read, or the file is left by a cluster that is gone
/// ([`stale_cluster`]): a front end would only try dead nodes.
pub fn load_cluster(cluster: Option<&Path>) -> Result<(PathBuf, ClusterFile, Secret)> {
    let (path, file, secret) = load_cluster_as_it_is(cluster)?;
    if let Some(stale) = stale_cluster(&path, &file) {
        bail!("{stale}: start the cluster again (`remem up`), or pass the --cluster of a running one");
    }
    Ok((path, file, secret))
}

/// The cluster file `--cluster` names: the default cluster's without one, and DIR/cluster.json
/// when it names a directory (the `--dir` of `remem up`, which users pass as often as the file).
pub fn cluster_file_path(cluster: Option<&Path>) -> PathBuf {
    match cluster {
        None => default_dir().join("cluster.json"),
        Some(path) if path.is_dir() => path.join("cluster.json"),
        Some(path) => path.to_path_buf(),
    }
}

/// [`load_cluster`], also when the cluster is gone: for `remem status`, which shows every node
/// of the file, down ones included.
pub fn load_cluster_as_it_is(cluster: Option<&Path>) -> Result<(PathBuf, ClusterFile, Secret)> {
    let path = cluster_file_path(cluster);
    let file = ClusterFile::load(&path)?;
    let secret = Secret::load(Some(&file.secret_file))
        .map_err(|error| anyhow::anyhow!("{error}"))
        .with_context(|| format!("loading the secret {}", file.secret_file.display()))?;
    Ok((path, file, secret))
}

/// Why the cluster file at `path` names a cluster that is gone, if it does: every node has a
/// recorded PID (only `remem up` and `demo` record them, for nodes on this host) and none of
/// them is a running `remem node`. That is what a `remem up` that was SIGKILLed leaves: its
/// nodes die with it (they get SIGTERM when it dies), but it cannot remove its cluster file. One
/// node down, or a file without PIDs (nodes started by hand, or by etcd's records), is a
/// cluster, not a stale file.
pub fn stale_cluster(path: &Path, file: &ClusterFile) -> Option<String> {
    let pids: Option<Vec<u32>> = file.nodes.iter().map(|node| node.pid).collect();
    let pids = pids.filter(|pids| !pids.is_empty())?;
    if pids.iter().any(|&pid| crate::process::is_remem(pid, "node")) {
        return None;
    }
    let listed: Vec<String> = pids.iter().map(u32::to_string).collect();
    Some(format!(
        "cluster file {} is left by a cluster that is gone (a `remem up` that was killed?): none of \
         its {} nodes runs (pids {})",
        path.display(),
        pids.len(),
        listed.join(", ")
    ))
}

/// Makes `dir` a directory only this user can enter: created 0700 if missing; if it exists it
/// must be a real directory (not a symlink) owned by this user, and it is made 0700. Anything
/// else is refused: another user's directory (a predictable name in /tmp) could hand us a
/// symlink to overwrite, or read the secret we write.
pub fn private_directory(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if let Some(parent) = dir.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => {
            return Err(error).with_context(|| format!("creating cluster directory {}", dir.display()))
        }
    }
    let meta = std::fs::symlink_metadata(dir).with_context(|| format!("inspecting {}", dir.display()))?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.file_type().is_dir() {
        bail!(
            "{} is not a directory (a symlink?): refusing to use it for the cluster's files",
            dir.display()
        );
    }
    if meta.uid() != uid {
        bail!(
            "{} belongs to user {}, not to us ({uid}): refusing to put the cluster secret there; \
             choose another --dir",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private", dir.display()))?;
    }
    Ok(())
}

/// Writes a new file readable by this user only, from the first byte (mode 0600 at creation, an
/// old file of that name removed first, no symlink followed).
pub fn write_private_file(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error).with_context(|| format!("removing the old {}", path.display())),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(bytes).with_context(|| format!("writing {}", path.display()))
}
