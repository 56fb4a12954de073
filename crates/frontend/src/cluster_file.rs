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

/// Refuses a saved slab map that was saved on another cluster (`saved` says what holds it),
/// typically before `remem up` started a new one in the same directory: reopening it could only
/// fail on unreachable nodes, or find the new cluster's nodes on some of the old ports and take
/// their empty memory for the saved slabs. The map names its cluster by the secret's
/// [`Secret::cluster_tag`]; a map from before there was one is told by its nodes: none of them
/// is in the cluster file.
pub fn check_saved_on_cluster(
    map: &remem_client::SlabMapFile,
    cluster: &ClusterFile,
    cluster_path: &Path,
    secret: &Secret,
    saved: &str,
) -> Result<()> {
    let ours = |address: &SocketAddr| cluster.nodes.iter().any(|node| node.address == *address);
    let why = match &map.cluster {
        Some(tag) if *tag != secret.cluster_tag() => {
            format!(
                "it names cluster {tag}, and {} is cluster {}",
                cluster_path.display(),
                secret.cluster_tag()
            )
        }
        None if !map.nodes.is_empty() && !map.nodes.iter().any(ours) => {
            format!("none of its {} nodes is in {}", map.nodes.len(), cluster_path.display())
        }
        _ => return Ok(()),
    };
    bail!(
        "{saved} was saved on another cluster: {why} (a new `remem up` in the same directory \
         starts a new cluster, with a new secret, and its old slabs are gone); pass --fresh to \
         drop it and start empty, or --cluster of the cluster it was saved on"
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use remem_client::cluster::ClusterNode;

    fn cluster(ports: &[u16]) -> ClusterFile {
        let nodes = ports
            .iter()
            .map(|port| ClusterNode {
                address: SocketAddr::from(([127, 0, 0, 1], *port)),
                failure_domain: format!("node-{port}"),
                pid: None,
                unix_socket: None,
                metrics: None,
            })
            .collect();
        ClusterFile { secret_file: PathBuf::from("/nonexistent/secret"), nodes, encrypt: false }
    }

    fn map(ports: &[u16], cluster: Option<String>) -> remem_client::SlabMapFile {
        remem_client::SlabMapFile {
            client_id: 1,
            data_splits: 1,
            parity_splits: 1,
            extra_reads: 0,
            page_bytes: 4096,
            address_space_bytes: 4096,
            pages_per_range: 1,
            nodes: ports.iter().map(|port| SocketAddr::from(([127, 0, 0, 1], *port))).collect(),
            ranges: vec![vec![(0, 1), (1, 1)]],
            unix_sockets: Vec::new(),
            more_regions: Vec::new(),
            cluster,
            lost_pages: Vec::new(),
        }
    }

    fn secret(byte: u8) -> Secret {
        Secret::from_bytes(vec![byte; 32]).unwrap()
    }

    #[test]
    fn a_map_of_another_secret_is_refused_even_when_the_new_nodes_took_its_ports() {
        let (old, new) = (secret(1), secret(2));
        let saved = map(&[7001, 7002], Some(old.cluster_tag()));
        let same_ports = cluster(&[7001, 7002, 7003]);
        let path = Path::new("/run/remem/cluster.json");
        let error = check_saved_on_cluster(&saved, &same_ports, path, &new, "the map").unwrap_err();
        assert!(error.to_string().contains("saved on another cluster"), "{error}");
        assert!(error.to_string().contains("--fresh"), "{error}");
        check_saved_on_cluster(&saved, &same_ports, path, &old, "the map").expect("its own cluster");
    }

    #[test]
    fn a_map_without_a_cluster_tag_is_judged_by_its_nodes() {
        let (saved, path) = (map(&[7001, 7002], None), Path::new("/run/remem/cluster.json"));
        let error =
            check_saved_on_cluster(&saved, &cluster(&[8001]), path, &secret(1), "the map").unwrap_err();
        assert!(error.to_string().contains("none of its 2 nodes"), "{error}");
        check_saved_on_cluster(&saved, &cluster(&[7002]), path, &secret(1), "the map")
            .expect("a node in common");
    }
}
