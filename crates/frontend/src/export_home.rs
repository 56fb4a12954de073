//! etcd as the home of a cluster's metadata (`--etcd`, docs/ETCD.md), beside the embedded
//! default (a cluster file written by `remem up` and a local slab-map file).
//!
//! [`ExportHome`] is what a front end asks of either: which nodes to hand its client, where its
//! slab map is saved after rebuilds, and whether another process has taken its export over.
//! [`FileHome`] is today's cluster file and slab-map file; [`EtcdHome`] follows etcd's
//! membership and keeps the map in etcd under the owner key of remem-etcd's `ClientSession`.
//! (`remem node --etcd` registers with the cli's `etcd_cluster::register_node`; `remem status
//! --etcd` reads the registrations there too.)
//!
//! Neither home is ever waited for on the data path: the etcd one reads a membership snapshot
//! that a background task keeps, and queues map writes for that task.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use remem_client::{Client, ClientConfig, NodeAddress, SlabMapFile};
use remem_etcd::{ClientName, ClientSession, Etcd, EtcdConfig, MembershipWatch, NodeRecord, OwnerRecord};

/// `--etcd` and `--etcd-prefix`, shared by node, nbd and status.
#[derive(Args, Debug, Clone)]
pub struct EtcdArgs {
    /// Keep membership and slab maps in etcd instead of a cluster file: comma-separated
    /// http://HOST:PORT URLs of its members (docs/ETCD.md). Nodes register there; front ends
    /// find the nodes and their slab map there.
    #[arg(long, value_name = "URLS", value_parser = parse_endpoints)]
    pub etcd: Option<Endpoints>,
    /// Prefix of remem's keys in etcd (several clusters can share one etcd).
    #[arg(long, default_value = EtcdConfig::DEFAULT_PREFIX, value_name = "PREFIX", requires = "etcd")]
    pub etcd_prefix: String,
    /// Seconds a lease in etcd lives, kept alive every third of it (default 10): how long a
    /// dead process keeps its name (a front end's owner key, a node's record), so how soon a
    /// restart or a standby takes over. Shorter leases lapse sooner when etcd is slow too.
    #[arg(long, value_name = "SECONDS", requires = "etcd", value_parser = clap::value_parser!(i64).range(2..=3600))]
    pub etcd_lease_seconds: Option<i64>,
}

/// The parsed URLs of `--etcd`.
#[derive(Clone, Debug)]
pub struct Endpoints(pub Vec<String>);

fn parse_endpoints(text: &str) -> Result<Endpoints, String> {
    remem_etcd::parse_endpoints(text).map(Endpoints)
}

impl EtcdArgs {
    /// The etcd connection, if `--etcd` was given (no I/O yet: etcd may be down), with leases of
    /// `--etcd-lease-seconds`.
    pub fn connect(&self) -> Result<Option<Etcd>> {
        let Some(endpoints) = &self.etcd else { return Ok(None) };
        let mut config = EtcdConfig::new(endpoints.0.clone(), &self.etcd_prefix);
        if let Some(seconds) = self.etcd_lease_seconds {
            config = config.with_lease_ttl(seconds);
        }
        Ok(Some(Etcd::new(config).context("--etcd")?))
    }
}

/// Where a front end's nodes and slab map live.
pub trait ExportHome: Send {
    /// Nodes the client has not joined yet; cheap enough for every background pass.
    fn new_nodes(&mut self) -> Vec<NodeAddress>;
    /// The client took `address`.
    fn joined(&mut self, address: SocketAddr);
    /// Saves the map after rebuilds moved slabs; never waits for etcd (a write is queued).
    fn save_map(&mut self, map: &SlabMapFile) -> Result<()>;
    /// Set once another process owns the export: stop serving at once, write nothing more.
    fn fenced(&self) -> Option<String>;
}

/// Saves a client's slab map again after rebuilds moved slabs, so that a restart finds them
/// where they are now: the one rule of nbd, fs and kv. A failed save is logged and tried again
/// at the next call (the rebuilds stay unsaved until one succeeds).
pub struct RebuildSaves {
    /// How many rebuilds the saved map reflects.
    saved: u64,
}

impl RebuildSaves {
    /// For a client whose map was just saved (or opened).
    pub fn new(client: &Client) -> RebuildSaves {
        RebuildSaves { saved: client.regeneration_status().done }
    }

    /// Saves through `save` when rebuilds finished since the last save.
    pub fn after_rebuilds<E: std::fmt::Display>(
        &mut self,
        client: &Client,
        save: impl FnOnce(&Client) -> std::result::Result<(), E>,
    ) {
        let done = client.regeneration_status().done;
        if done == self.saved {
            return;
        }
        match save(client) {
            Ok(()) => self.saved = done,
            Err(error) => tracing::warn!(%error, "cannot save the slab map after a rebuild; will retry"),
        }
    }
}

/// The embedded default: the cluster file (`ClusterWatch`) and a local slab-map file.
pub struct FileHome {
    pub watch: crate::cluster_watch::ClusterWatch,
    pub state_path: PathBuf,
}

impl ExportHome for FileHome {
    fn new_nodes(&mut self) -> Vec<NodeAddress> {
        self.watch.new_nodes()
    }

    fn joined(&mut self, address: SocketAddr) {
        self.watch.joined(address)
    }

    fn save_map(&mut self, map: &SlabMapFile) -> Result<()> {
        map.save(&self.state_path).with_context(|| format!("saving {}", self.state_path.display()))
    }

    fn fenced(&self) -> Option<String> {
        None
    }
}

/// How often the etcd home looks at the membership snapshot.
const MEMBERSHIP_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// etcd: the membership watch and this process's ownership of its export's keys.
pub struct EtcdHome {
    session: ClientSession,
    membership: MembershipWatch,
    known: Vec<SocketAddr>,
    last_check: Instant,
    hostname: String,
    /// The owner record's session, named in the endpoint record.
    owner_session: u64,
}

impl EtcdHome {
    pub fn describe(&self) -> String {
        format!("etcd keys {} and {}", self.session.map_key(), self.session.owner_key())
    }

    /// Publishes `address` as where this process serves the export (`clients/NAME/endpoint`, on
    /// its owner lease: docs/ETCD.md).
    ///
    /// Errors: an address no one can connect to (unspecified, port 0); etcd unreachable or the
    /// lease lapsed (the record is put again when the name is claimed again).
    pub fn publish_endpoint(&self, address: SocketAddr) -> Result<()> {
        let record = remem_etcd::EndpointRecord {
            address,
            hostname: self.hostname.clone(),
            pid: std::process::id(),
            session: self.owner_session,
        };
        self.session.publish_endpoint(&record).context("publishing the endpoint in etcd")
    }
}

impl ExportHome for EtcdHome {
    fn new_nodes(&mut self) -> Vec<NodeAddress> {
        if self.last_check.elapsed() < MEMBERSHIP_CHECK_INTERVAL {
            return Vec::new();
        }
        self.last_check = Instant::now();
        self.membership
            .nodes()
            .iter()
            .filter(|node| !self.known.contains(&node.address))
            .map(|node| node_address(node, &self.hostname))
            .collect()
    }

    fn joined(&mut self, address: SocketAddr) {
        self.known.push(address);
    }

    fn save_map(&mut self, map: &SlabMapFile) -> Result<()> {
        self.session.save_map_in_background(serde_json::to_vec(map).context("encoding the slab map")?);
        Ok(())
    }

    fn fenced(&self) -> Option<String> {
        self.session.fenced()
    }
}

/// A node's address for this client: its Unix socket only if it runs on this host.
fn node_address(node: &NodeRecord, hostname: &str) -> NodeAddress {
    let same_host = !hostname.is_empty() && node.hostname == hostname;
    NodeAddress { address: node.address, unix_socket: node.unix_socket.clone().filter(|_| same_host) }
}

/// What `remem nbd --etcd` needs to open its export.
pub struct EtcdExportRequest<'a> {
    pub etcd: Etcd,
    pub export: &'a str,
    pub secret: &'a remem_client::Secret,
    pub config: ClientConfig,
    pub fresh: bool,
    pub placement: Box<dyn remem_placement::Placement>,
}

/// Claims the export in etcd, then reopens its saved slab map (its pages as they were, from
/// whichever host) or connects a new client to the registered nodes and saves its map.
///
/// Errors: the export is held by another live process (after waiting one lease for a dead one
/// to lapse); etcd unreachable; no node registered; a saved map of another size or shape;
/// the nodes refuse.
pub fn open_export(request: EtcdExportRequest<'_>) -> Result<(Client, EtcdHome)> {
    let EtcdExportRequest { etcd, export, secret, config, fresh, placement } = request;
    let mut claimed = claim_export(etcd, export)?;
    let map_key = claimed.map_key().to_owned();
    if let (true, Some(map)) = (fresh, &claimed.saved) {
        if let Err(error) = Client::release_saved(map, secret, config.clone()) {
            tracing::warn!(%error, "cannot reach the saved export to unmap its slabs");
        }
        claimed.delete_saved()?;
    }
    let client = match claimed.saved.take() {
        Some(map) => {
            if !map.fits(config.address_space_bytes, &config.shape) {
                bail!(
                    "{map_key} holds an export of {} bytes at ({},{}), not {} at ({},{}): pass its --size, -k \
                     and -r, or --fresh to drop it and start empty",
                    map.address_space_bytes,
                    map.data_splits,
                    map.parity_splits,
                    config.address_space_bytes,
                    config.shape.data_splits,
                    config.shape.parity_splits
                );
            }
            let client = Client::reopen(&map, secret, config)
                .with_context(|| format!("reopening the export saved in etcd ({map_key})"))?;
            eprintln!("reopened the export saved in etcd ({map_key}; --fresh to start empty)");
            client
        }
        None => {
            if claimed.nodes.is_empty() {
                bail!("no node is registered in etcd under {}", claimed.etcd.keys().nodes());
            }
            let client = Client::connect(&claimed.addresses(), secret, config, placement)
                .context("connecting to the nodes registered in etcd")?;
            claimed.save_map_now(&client.slab_map())?;
            client
        }
    };
    // The nodes registered at the claim count as known too: an export's client is whole at its
    // start (only nodes registered later join it).
    let registered: Vec<SocketAddr> = claimed.nodes.iter().map(|node| node.address).collect();
    let mut home = claimed.into_home(&client);
    home.known.extend(registered);
    Ok((client, home))
}

/// A slab map read from etcd, checked as a map file is.
pub fn decode_map(key: &str, bytes: &[u8]) -> Result<SlabMapFile> {
    let map: SlabMapFile =
        serde_json::from_slice(bytes).with_context(|| format!("{key} does not hold a slab map"))?;
    map.validate().map_err(|message| anyhow::anyhow!("{key} holds an invalid slab map: {message}"))?;
    Ok(map)
}

/// An export claimed in etcd whose client is not open yet: for a front end that opens its
/// client itself (`remem kv`: several regions of one client, reopened or made by its own
/// rules). [`claim_export`] makes it; [`ClaimedExport::into_home`] turns it into the
/// [`EtcdHome`] the front end follows membership and saves its map through.
pub struct ClaimedExport {
    etcd: Etcd,
    session: ClientSession,
    /// The nodes registered when the export was claimed.
    pub nodes: Vec<NodeRecord>,
    /// The saved slab map, decoded and validated (`SlabMapFile::validate`), if there is one.
    pub saved: Option<SlabMapFile>,
    hostname: String,
    owner_session: u64,
}

/// Claims `export` in etcd (as [`open_export`] does: a live holder is waited for one lease,
/// then refused, naming it) and reads the registered nodes and the saved slab map.
///
/// Errors: the export is held by another live process; etcd unreachable; a saved map that does
/// not decode or validate (hostile or damaged: never used).
pub fn claim_export(etcd: Etcd, export: &str) -> Result<ClaimedExport> {
    let wait = Duration::from_secs(etcd.config().lease_ttl_seconds as u64 + 2);
    claim_export_within(etcd, export, wait)
}

/// [`claim_export`], waiting at most `wait` for a live holder (a standby polls with a short one).
///
/// Errors: as [`claim_export`]; a holder still live after `wait` is `remem_etcd::EtcdError::Held`
/// in the chain.
pub fn claim_export_within(etcd: Etcd, export: &str, wait: Duration) -> Result<ClaimedExport> {
    let name = ClientName::new(export).context("--export names the export's keys in etcd")?;
    let hostname = remem_etcd::hostname();
    let owner = OwnerRecord {
        hostname: hostname.clone(),
        pid: std::process::id(),
        session: rand::random(),
        started_unix_ms: remem_etcd::unix_ms(),
    };
    let session = ClientSession::claim(&etcd, &name, &owner, wait).context("claiming the export in etcd")?;
    let nodes = etcd.nodes().context("reading the nodes registered in etcd")?;
    let saved = match session.load_map().context("reading the saved slab map")? {
        None => None,
        Some(bytes) => Some(decode_map(session.map_key(), &bytes)?),
    };
    Ok(ClaimedExport { etcd, session, nodes, saved, hostname, owner_session: owner.session })
}

impl ClaimedExport {
    /// The key of the export's slab map, for messages.
    pub fn map_key(&self) -> &str {
        self.session.map_key()
    }

    /// The registered nodes as this host's client reaches them (Unix sockets of nodes on this
    /// host only).
    pub fn addresses(&self) -> Vec<NodeAddress> {
        self.nodes.iter().map(|node| node_address(node, &self.hostname)).collect()
    }

    /// Deletes the saved slab map (compare-and-swap, `--fresh`); the caller unmaps its slabs.
    pub fn delete_saved(&mut self) -> Result<()> {
        self.session.delete_map().context("deleting the saved slab map")?;
        self.saved = None;
        Ok(())
    }

    /// Saves `map` now by compare-and-swap; fails when fenced or etcd does not answer.
    pub fn save_map_now(&self, map: &SlabMapFile) -> Result<()> {
        save_now(&self.session, map)
    }

    /// The home of the opened client: membership followed from the nodes registered at the
    /// claim. Only the client's own nodes count as known: a registered node a reopened map does
    /// not name is handed to the client at the first [`ExportHome::new_nodes`] (a front end
    /// whose ranges are mapped as it grows places them on every registered node).
    pub fn into_home(self, client: &Client) -> EtcdHome {
        let ClaimedExport { etcd, session, nodes, hostname, owner_session, .. } = self;
        // The client's nodes (it may have no region yet, so no slab map to ask).
        let known: Vec<SocketAddr> = client.node_addresses().collect();
        let membership = MembershipWatch::start(&etcd, &nodes);
        EtcdHome { session, membership, known, last_check: Instant::now(), hostname, owner_session }
    }
}

impl EtcdHome {
    /// Saves `map` now by compare-and-swap, waiting for etcd (up to its request deadline): for a
    /// front end that must know its map is saved before it uses new slabs. A fence is also
    /// reported by [`ExportHome::fenced`] from then on.
    pub fn save_map_now(&self, map: &SlabMapFile) -> Result<()> {
        save_now(&self.session, map)
    }
}

fn save_now(session: &ClientSession, map: &SlabMapFile) -> Result<()> {
    let bytes = serde_json::to_vec(map).context("encoding the slab map")?;
    session.save_map(bytes).with_context(|| format!("saving the slab map in etcd ({})", session.map_key()))
}
