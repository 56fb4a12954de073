//! The clients of `remem fs`: the file contents' client, and with remote metadata the metadata
//! area's client, each reopened from its saved slab map or new, from the cluster file and the
//! state directory (`slabmap.json`, `metamap.json`) or from etcd (under the file system's name
//! and that name with `.meta`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use remem_client::cluster::ClusterFile;
use remem_client::{ClientConfig, Secret};
use remem_etcd::Etcd;
use remem_frontend::export_home::{EtcdExportRequest, ExportHome, FileHome};

use super::FsArgs;
use crate::{Fence, HomedClient, StateDir};

use crate::persist::META_MAP_FILE;

/// Where the clients' nodes and maps come from. Made once per mount: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Source<'a> {
    File { cluster: &'a ClusterFile, cluster_path: &'a Path, secret: &'a Secret },
    Etcd { etcd: Etcd, name: String, secret: Secret },
}

/// The opened clients.
pub struct Clients {
    pub data: HomedClient,
    /// The metadata area's client (remote metadata only).
    pub meta: Option<HomedClient>,
    pub fence: Arc<Fence>,
}

/// The name of the metadata client in etcd.
pub fn meta_name(name: &str) -> String {
    format!("{name}.meta")
}

/// Opens the data client and, when `meta_config` is given, the metadata client. `--fresh` and
/// `--ephemeral` drop what was saved first.
pub fn open_clients(
    args: &FsArgs,
    state: &StateDir,
    config: ClientConfig,
    meta_config: Option<ClientConfig>,
    source: Source<'_>,
) -> Result<Clients> {
    let fence = Arc::new(Fence::default());
    let fresh = args.fresh || args.ephemeral;
    match source {
        Source::File { cluster, cluster_path, secret } => {
            let file = FileSource { args, state, cluster, cluster_path, secret };
            if fresh {
                file.drop_saved(&config)?;
            }
            file.check_saved(meta_config.is_some())?;
            let (client, home) = file.open(config, state.slab_map_path(), "the file system's client")?;
            let data = HomedClient::new(client, home, "the file system's client", Arc::clone(&fence));
            let meta = match meta_config {
                Some(config) => {
                    let (client, home) =
                        file.open(config, state.path().join(META_MAP_FILE), "the metadata client")?;
                    Some(HomedClient::new(client, home, "the metadata client", Arc::clone(&fence)))
                }
                None => None,
            };
            Ok(Clients { data, meta, fence })
        }
        Source::Etcd { etcd, name, secret } => {
            let Some(meta_config) = meta_config else { bail!("--etcd keeps the metadata in remote memory") };
            let open = |config: ClientConfig, export: &str| {
                let request = EtcdExportRequest {
                    etcd: etcd.clone(),
                    export,
                    secret: &secret,
                    config,
                    fresh,
                    placement: args.client.placement.build(rand::random()),
                };
                remem_frontend::export_home::open_export(request)
                    .with_context(|| format!("opening {export:?} through etcd"))
            };
            // The metadata first: a file system whose metadata was never saved is new, whatever
            // its contents' map says.
            let (meta, meta_home) = open(meta_config, &meta_name(&name))?;
            let (data, data_home) = open(config, &name)?;
            eprintln!("file system {name:?} kept in {} and {}", data_home.describe(), meta_home.describe());
            let data =
                HomedClient::new(data, Box::new(data_home), "the file system's client", Arc::clone(&fence));
            let meta = HomedClient::new(meta, Box::new(meta_home), "the metadata client", Arc::clone(&fence));
            Ok(Clients { data, meta: Some(meta), fence })
        }
    }
}

/// A client from the cluster file, its map in a state directory file.
struct FileSource<'a> {
    args: &'a FsArgs,
    state: &'a StateDir,
    cluster: &'a ClusterFile,
    cluster_path: &'a Path,
    secret: &'a Secret,
}

impl FileSource<'_> {
    /// Refuses saved metadata this mount cannot use: metadata without the map that finds its
    /// pages, or metadata kept the other way (local or remote) than asked.
    fn check_saved(&self, remote: bool) -> Result<()> {
        let dir = self.state.path().display();
        let meta_map = self.state.path().join(META_MAP_FILE);
        if !self.state.slab_map_path().exists() && (self.state.has_metadata() || meta_map.exists()) {
            bail!(
                "{dir} holds file system metadata but no slab map (slabmap.json): its files cannot be found; \
                 pass --fresh to drop it and start empty"
            );
        }
        if remote && self.state.has_metadata() {
            bail!(
                "the file system in {dir} keeps its metadata in the state directory: drop --metadata remote"
            );
        }
        if !remote && meta_map.exists() {
            bail!("the file system in {dir} keeps its metadata in remote memory: pass --metadata remote");
        }
        if remote && self.state.slab_map_path().exists() && !meta_map.exists() {
            bail!("{dir} has a slab map but no metadata map ({META_MAP_FILE}): pass --fresh to start empty");
        }
        Ok(())
    }

    /// `--fresh`: unmaps the saved clients' slabs (refused while a running process serves
    /// them) and empties the state directory.
    fn drop_saved(&self, config: &ClientConfig) -> Result<()> {
        let dir = self.state.path().display();
        for map_path in [self.state.slab_map_path(), self.state.path().join(META_MAP_FILE)] {
            if map_path.exists() {
                let what = format!("the file system in {dir}");
                remem_frontend::open::release_saved(&what, &map_path, self.secret, config)?;
            }
        }
        self.state.clear().with_context(|| format!("clearing the state directory {dir}"))
    }

    /// The client whose map is `map_path`: reopened, or new with its map saved.
    fn open(
        &self,
        config: ClientConfig,
        map_path: PathBuf,
        what: &str,
    ) -> Result<(remem_client::Client, Box<dyn ExportHome>)> {
        let what = format!("{what} of the file system in {}", self.state.path().display());
        let (client, _) = remem_frontend::open::open_or_reopen(remem_frontend::open::OpenRequest {
            what: &what,
            map_path: &map_path,
            fresh: false,
            cluster: self.cluster,
            cluster_path: self.cluster_path,
            secret: self.secret,
            config,
            placement: &self.args.client.placement,
            other_choices: "another --state or --name, ",
        })?;
        let watch =
            remem_frontend::cluster_watch::ClusterWatch::new(self.cluster_path.to_owned(), self.cluster);
        let home: Box<dyn ExportHome> = Box::new(FileHome { watch, state_path: map_path });
        Ok((client, home))
    }
}
