//! One open-or-reopen for the front ends whose client lives in one region with its slab map in a
//! local file (`remem nbd`, `remem fs`; with `--etcd`, `export_home::open_export` is the same
//! rule with the map in etcd): the saved client reopened with its pages as they were, or a new
//! one whose map is saved at once, durably, before anything is written through it.
//!
//! Rules: `fresh` unmaps the saved slabs first and refuses when the nodes say the client is
//! being served by a running process (taking it would serve an empty one under the same name);
//! a saved map none of whose nodes is in the cluster file is refused; a saved map of another
//! size or shape is refused, naming the flags that would open it.

use std::path::Path;

use anyhow::{bail, Context, Result};
use remem_client::cluster::ClusterFile;
use remem_client::{Client, ClientConfig, ConnectError, Secret, SlabMapFile};

/// What to open, and the words to name it in messages.
pub struct OpenRequest<'a> {
    /// "export \"disk\"", "the file system in /var/lib/remem/fs-default", ...
    pub what: &'a str,
    pub map_path: &'a Path,
    pub fresh: bool,
    pub cluster: &'a ClusterFile,
    pub cluster_path: &'a Path,
    pub secret: &'a Secret,
    pub config: ClientConfig,
    pub placement: &'a crate::placement_arg::PlacementArgs,
    /// The flags that choose another saved client (nbd: none; fs: "another --state or --name, ").
    pub other_choices: &'a str,
}

/// The client and whether it was reopened (false: new, its map saved).
pub fn open_or_reopen(request: OpenRequest<'_>) -> Result<(Client, bool)> {
    let OpenRequest {
        what,
        map_path,
        fresh,
        cluster,
        cluster_path,
        secret,
        config,
        placement,
        other_choices,
    } = request;
    if map_path.exists() {
        if fresh {
            release_saved(what, map_path, secret, &config)?;
        } else {
            let map = SlabMapFile::load(map_path)?;
            crate::cluster_file::check_saved_on_cluster(&map, cluster, cluster_path, secret, what)?;
            let (size, shape) = (config.address_space_bytes, &config.shape);
            if !map.fits(size, shape) {
                bail!(
                    "{what} is of {} at ({},{}), not {} at ({},{}): pass its --size, -k and -r, \
                     {other_choices}or --fresh to drop it and start empty",
                    remem_client::format_bytes(map.address_space_bytes),
                    map.data_splits,
                    map.parity_splits,
                    remem_client::format_bytes(size),
                    shape.data_splits,
                    shape.parity_splits
                );
            }
            let client = Client::reopen(&map, secret, config).with_context(|| format!("reopening {what}"))?;
            return Ok((client, true));
        }
    }
    let client = Client::connect(&cluster.addresses(), secret, config, placement.build(rand::random()))
        .with_context(|| format!("connecting to the cluster of {}", cluster_path.display()))?;
    client.save_map(map_path).with_context(|| format!("saving the slab map to {}", map_path.display()))?;
    Ok((client, false))
}

/// `--fresh`: unmaps the saved client's slabs and removes its map. A map that cannot be read or
/// nodes that cannot be reached are warned about (the slabs stay until their lease lapses); a
/// client the nodes say is served by a running process is refused.
pub fn release_saved(what: &str, map_path: &Path, secret: &Secret, config: &ClientConfig) -> Result<()> {
    match SlabMapFile::load(map_path) {
        Ok(map) => match Client::release_saved(&map, secret, config.clone()) {
            Ok(()) => {}
            Err(error @ ConnectError::ClientIdInUse { .. }) => bail!(
                "{what} is served by a running process (the nodes refuse: {error}); stop it before \
                 --fresh drops it"
            ),
            Err(error) => eprintln!("warning: cannot reach the slabs of {what} to unmap them: {error}"),
        },
        Err(error) => eprintln!("warning: {error}; the slabs of {what} are not unmapped"),
    }
    std::fs::remove_file(map_path).with_context(|| format!("removing {}", map_path.display()))
}
