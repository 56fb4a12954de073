//! `remem kv --etcd URLS --export NAME` (docs/KV.md "Host loss", docs/ETCD.md): the kv claims
//! its name in etcd (remem-frontend's `claim_export`: an owner key on a lease; a live holder is
//! refused after one lease), keeps its slab map there (compare-and-swap at start, whenever
//! ranges are mapped or given back, after rebuilds), follows the nodes registered there, and
//! keeps its state in its own remote memory (`crate::cache::mirror`), so that the same command
//! on another host, with nothing local carried over, serves every acknowledged item.
//!
//! The state directory (`--state`, default `kv-NAME` in `remem up`'s default directory) holds
//! only working copies: the backup region and the rewrites log, rewritten from the state
//! region at every start. A fenced process (its lease lapsed and another claimed the name, or a
//! map write failed its compare-and-swap) stops serving and exits with an error.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use remem_client::{Client, ClientConfig, Secret};
use remem_frontend::export_home::{claim_export, ClaimedExport, EtcdHome, ExportHome, RebuildSaves};

use super::remote_state::{read_state_region, Found};
use super::state::{default_backup_bytes, KvState};
use super::KvArgs;
use crate::backup::Backup;
use crate::cache::mirror::StateRegion;
use crate::cache::open::{build_cache, cache_over_regions_and_state, state_region_shape, STATE_LABEL};
use crate::{Cache, CacheConfig, Server};

type Home = Rc<RefCell<EtcdHome>>;

/// After a map save failed (etcd unreachable), saves fail at once for this long instead of
/// waiting for etcd's deadline (5 s) again: while etcd is away the loop waits for it at most
/// once in this time (a range not mapped meanwhile makes its region count as full).
const SAVE_BACKOFF: Duration = Duration::from_secs(10);

/// The one way the map is saved (growth, rebuilds): by compare-and-swap, waiting for etcd,
/// unless a save failed less than [`SAVE_BACKOFF`] ago.
#[derive(Clone)]
struct MapSaves {
    home: Home,
    failed_at: Rc<Cell<Option<Instant>>>,
}

impl MapSaves {
    fn new(home: EtcdHome) -> MapSaves {
        MapSaves { home: Rc::new(RefCell::new(home)), failed_at: Rc::default() }
    }

    fn save(&self, map: &remem_client::SlabMapFile) -> Result<()> {
        if let Some(at) = self.failed_at.get().filter(|at| at.elapsed() < SAVE_BACKOFF) {
            bail!("etcd did not take the last map {:.0?} ago; trying again later", at.elapsed());
        }
        let result = self.home.borrow().save_map_now(map);
        self.failed_at.set(result.is_err().then(Instant::now));
        result
    }
}

/// Runs `remem kv --etcd` until SIGTERM, Ctrl-C or a fence (an error then); with `--standby`,
/// first waits for the name (`super::etcd_standby`).
pub fn run(
    args: &KvArgs,
    access: (Option<crate::auth::Credentials>, Option<Arc<rustls::ServerConfig>>),
    cache_config: CacheConfig,
    stop: Arc<AtomicBool>,
    metrics: Option<Arc<Mutex<String>>>,
) -> Result<()> {
    let Some(export) = args.export.as_deref() else {
        bail!("--etcd needs --export NAME: the name the kv's keys are kept under in etcd");
    };
    let Some((etcd, secret)) = args.connect.etcd()? else {
        bail!("remem kv --etcd: no etcd endpoint given");
    };
    let policy = cache_config.policy.clone();
    let ec = cache_config.ec;
    if args.standby {
        // A waiting standby stops on SIGTERM.
        signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
        signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    }
    let Some(Opened { cache, saves, took_over, _state }) =
        claim_and_open(args, &etcd, export, &secret, cache_config, &stop)?
    else {
        return Ok(());
    };
    let map_key = saves.home.borrow().describe();
    let config = super::server_config(args, args.listen, args.unix.clone(), access);
    let mut server = Server::bind(cache, config).with_context(|| format!("binding {}", args.listen))?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    let address = server.local_addr().expect("a TCP listener");
    publish_endpoint(&saves, address);
    if let Some(message) = took_over {
        eprintln!("{message}");
    }
    println!("listening {address}");
    std::io::stdout().flush()?;
    if let Some(command) = &args.takeover_command {
        super::etcd_standby::run_takeover_command(command, address, export);
    }
    let nodes = server.cache.client_mut().client().node_addresses().count();
    super::announce(args, &policy, ec, nodes);
    eprintln!("kv {export:?} kept in etcd ({map_key}) and its state region");
    let fenced = Rc::new(RefCell::new(None));
    server.on_housekeeping =
        Some(housekeeping(&mut server.cache, saves, Arc::clone(&stop), Rc::clone(&fenced), metrics));
    let result = server.run(&stop);
    if let Some(path) = &args.unix {
        let _ = std::fs::remove_file(path);
    }
    drop(server);
    if let Some(reason) = fenced.borrow_mut().take() {
        bail!("fenced: {reason}: another process owns kv {export:?} now; stopped serving");
    }
    result.context("serving")
}

/// The kv of the claimed name, opened, ready to bind.
struct Opened {
    cache: Cache,
    saves: MapSaves,
    /// A standby's takeover message.
    took_over: Option<String>,
    _state: KvState,
}

/// Claims the name and opens the kv. A primary claims it at once (waiting one lease for a dead
/// holder); a standby waits until the holder's lease lapses, and while a node still holds the
/// old primary's session (its host vanished: until the nodes' `--lease-timeout`) gives the name
/// back and claims it again. None: stopped (SIGTERM) while standing by.
fn claim_and_open(
    args: &KvArgs,
    etcd: &remem_etcd::Etcd,
    export: &str,
    secret: &Secret,
    cache_config: CacheConfig,
    stop: &AtomicBool,
) -> Result<Option<Opened>> {
    let ec = cache_config.ec;
    if !args.standby {
        let state = KvState::lock(&state_dir(args, export)?)?;
        let claimed = claim_export(etcd.clone(), export)?;
        let settings = super::client_config(args, ec, args.connect.encrypt)?;
        let (cache, saves) = open(claimed, args, secret, settings, cache_config, &state)?;
        return Ok(Some(Opened { cache, saves, took_over: None, _state: state }));
    }
    // The primary and the moment its name was first found free, kept across the retries.
    let mut first: Option<(Option<remem_etcd::OwnerRecord>, Instant)> = None;
    let mut said = false;
    loop {
        let settings = super::client_config(args, ec, args.connect.encrypt)?;
        let Some(takeover) = super::etcd_standby::wait_and_claim(etcd, export, &settings.0, stop)? else {
            return Ok(None);
        };
        let state = KvState::lock(&state_dir(args, export)?)?;
        let (primary, free_at) = first.get_or_insert((takeover.primary.clone(), takeover.free_at)).clone();
        match open(takeover.claimed, args, secret, settings, cache_config.clone(), &state) {
            Ok((cache, saves)) => {
                let took_over = super::etcd_standby::took_over(export, primary.as_ref(), free_at);
                return Ok(Some(Opened { cache, saves, took_over: Some(took_over), _state: state }));
            }
            Err(error) if super::etcd_standby::old_session_lives(&error) && !stop.load(Ordering::Relaxed) => {
                if !said {
                    eprintln!(
                        "the nodes still hold the old primary's session ({error:#}): its host may be gone, \
                         and the nodes close it after their --lease-timeout; trying again"
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(error) => return Err(error),
        }
    }
}

/// Publishes the serving address in etcd (`clients/NAME/endpoint`); an unspecified listen
/// address (0.0.0.0) is not published, since no client could connect to it.
fn publish_endpoint(saves: &MapSaves, address: std::net::SocketAddr) {
    if address.ip().is_unspecified() {
        eprintln!(
            "listening on {address}: no endpoint published in etcd (listen on a routable address for that)"
        );
        return;
    }
    if let Err(error) = saves.home.borrow().publish_endpoint(address) {
        tracing::warn!(error = %format!("{error:#}"), "the endpoint is not published in etcd");
    }
}

/// `--state`, or `kv-NAME` in `remem up`'s default directory (created private).
fn state_dir(args: &KvArgs, export: &str) -> Result<PathBuf> {
    if let Some(dir) = &args.state {
        return Ok(dir.clone());
    }
    let directory = remem_frontend::cluster_file::default_dir();
    remem_frontend::cluster_file::private_directory(&directory)?;
    Ok(directory.join(format!("kv-{export}")))
}

/// The cache of the claimed name: the saved one reopened with every item its state region
/// holds, or a new one whose map is saved in etcd before it serves.
fn open(
    mut claimed: ClaimedExport,
    args: &KvArgs,
    secret: &Secret,
    (config, placement): (ClientConfig, Box<dyn remem_placement::Placement>),
    cache_config: CacheConfig,
    state: &KvState,
) -> Result<(Cache, MapSaves)> {
    if args.fresh {
        if let Some(map) = &claimed.saved {
            if let Err(error) = Client::release_saved(map, secret, config.clone()) {
                tracing::warn!(%error, "cannot reach the saved kv's slabs to unmap them");
            }
            claimed.delete_saved()?;
        }
    }
    let map_key = claimed.map_key().to_owned();
    match claimed.saved.take() {
        Some(map) => {
            if !map.fits(config.address_space_bytes, &config.shape) {
                bail!(
                    "{map_key} holds {}: pass its -m, -k and -r, or --fresh to drop its items and start empty",
                    super::state::map_mismatch(&map, &config)
                );
            }
            let client = Client::reopen(&map, secret, config)
                .with_context(|| format!("reopening the slabs saved in etcd ({map_key})"))?;
            let saves = MapSaves::new(claimed.into_home(&client));
            let cache = reopen(client, cache_config, state, args, &saves)
                .with_context(|| format!("reopening the kv saved in etcd ({map_key})"))?;
            Ok((cache, saves))
        }
        None => {
            if claimed.nodes.is_empty() {
                bail!("no node is registered in etcd: start `remem node --etcd` first");
            }
            let config = ClientConfig { address_space_bytes: 0, ..config };
            let client = Client::connect(&claimed.addresses(), secret, config, placement)
                .context("connecting to the nodes registered in etcd")?;
            super::check_node_memory(&client, &cache_config, args.memory_limit)?;
            let saves = MapSaves::new(claimed.into_home(&client));
            let cache = create(client, cache_config, state, args, &saves)?;
            Ok((cache, saves))
        }
    }
}

/// The slab map saved by compare-and-swap, waiting for etcd: a range is used only once saved.
fn map_saver(saves: &MapSaves) -> crate::cache::growth::MapSaver {
    let saves = saves.clone();
    Box::new(move |map| saves.save(map).map_err(|error| format!("{error:#}")))
}

/// A new kv: its regions, the state region sized for its backup region, the map saved in etcd,
/// an empty state written out.
fn create(
    client: Client,
    cache_config: CacheConfig,
    state: &KvState,
    args: &KvArgs,
    saves: &MapSaves,
) -> Result<Cache> {
    let ec = cache_config.ec;
    let region_bytes = args.memory_limit.div_ceil(4096) * 4096;
    let mut cache = build_cache(client, cache_config, region_bytes).context("creating the regions")?;
    let backup = state.create_backup(args.backup_size.unwrap_or(default_backup_bytes(args.memory_limit)))?;
    let client = cache.client_mut().client();
    let info = client
        .create_region(state_region_shape(ec), 4096 + backup.file_bytes())
        .context("creating the state region")?;
    client.label_region(info.index, STATE_LABEL);
    let first_range = client.ranges().iter().position(|range| range.region == info.index).expect("a range");
    let region = StateRegion {
        first_page: info.first_page,
        page_count: info.page_count,
        first_range,
        pages_per_range: info.pages_per_range,
    };
    cache.set_map_saver(map_saver(saves));
    cache.save_map().map_err(anyhow::Error::msg).context("saving the new kv's slab map in etcd")?;
    empty_state(cache, region, backup, state)
}

/// Starts the state region empty: the backup region's header and a clear rewrites log written.
fn empty_state(mut cache: Cache, region: StateRegion, mut backup: Backup, state: &KvState) -> Result<Cache> {
    if 4096 + backup.file_bytes() > region.page_count * 4096 {
        bail!(
            "the state region ({} pages) is smaller than a backup region of {} bytes: start with the \
             --backup-size and -m it was made with, or --fresh",
            region.page_count,
            backup.file_bytes()
        );
    }
    cache.set_state_mirror(region);
    backup.track_dirty(true);
    cache.set_backup(backup);
    let (mut log, intents) = state.open_rewrites()?;
    for intent in intents {
        log.clear(intent.slot).context("clearing the rewrites file")?;
    }
    cache.set_rewrites(log);
    cache.persist_rewrites().map_err(anyhow::Error::msg)?;
    cache.durability_barrier().map_err(anyhow::Error::msg)?;
    Ok(cache)
}

/// The saved kv: its state region read back into the working copies, cut rewrites completed,
/// the index rebuilt from the records, and what the restore changed written out.
fn reopen(
    client: Client,
    cache_config: CacheConfig,
    state: &KvState,
    args: &KvArgs,
    saves: &MapSaves,
) -> Result<Cache> {
    let started = std::time::Instant::now();
    let (mut cache, region) = cache_over_regions_and_state(client, cache_config).map_err(|message| {
        anyhow::anyhow!(
            "{message}; start with the flags it was saved with (--scheme, --prefix-scheme, --small-scheme, \
             --large-scheme, -k, -r), or --fresh"
        )
    })?;
    cache.set_map_saver(map_saver(saves));
    let rewrites_path = state.dir.join(super::state::REWRITES_FILE);
    let found =
        read_state_region(cache.client_mut().client(), &region, &rewrites_path, &state.backup_path())?;
    let Found::Copied { pages, chunks } = found else {
        eprintln!("the saved kv wrote no state yet: starting empty");
        let backup =
            state.create_backup(args.backup_size.unwrap_or(default_backup_bytes(args.memory_limit)))?;
        return empty_state(cache, region, backup, state);
    };
    cache.set_state_mirror(region);
    state.complete_cut_rewrites(&mut cache)?;
    cache.persist_rewrites().map_err(anyhow::Error::msg)?;
    let slabs = started.elapsed();
    let (mut backup, records, scan) =
        Backup::open(&state.backup_path()).context("the state region's backup")?;
    let scanned = started.elapsed();
    backup.track_dirty(false);
    cache.set_backup(backup);
    let report = cache.restore(records, scan, crate::clock::now_unix());
    cache.durability_barrier().map_err(anyhow::Error::msg)?;
    eprintln!("read the state region: {pages} pages, {chunks} backup chunks");
    let times =
        super::state::ReopenTimes { slabs, scan: scanned - slabs, restore: started.elapsed() - scanned };
    super::report_reopened(&state.dir, &report, &times);
    Ok(cache)
}

/// Once a second: the metrics snapshot, the map saved after rebuilds, nodes registered since,
/// and the fence: a fenced process stops.
fn housekeeping(
    cache: &mut Cache,
    saves: MapSaves,
    stop: Arc<AtomicBool>,
    fenced: Rc<RefCell<Option<String>>>,
    metrics: Option<Arc<Mutex<String>>>,
) -> crate::server::Housekeeping {
    let mut rebuilds = RebuildSaves::new(cache.client_mut().client());
    let home = Rc::clone(&saves.home);
    Box::new(move |cache: &mut Cache| {
        let at_node =
            cache.client_mut().client().fenced_at_node().map(|reason| format!("at a node: {reason}"));
        if let Some(reason) = home.borrow().fenced().or(at_node) {
            tracing::error!(%reason, "fenced: stopping");
            *fenced.borrow_mut() = Some(reason);
            stop.store(true, Ordering::Relaxed);
            return;
        }
        if let Some(snapshot) = &metrics {
            let text = crate::report::prometheus(cache);
            if let Ok(mut shared) = snapshot.lock() {
                *shared = text;
            }
        }
        rebuilds.after_rebuilds(cache.client_mut().client(), |client| saves.save(&client.slab_map()));
        let nodes = home.borrow_mut().new_nodes();
        let client = cache.client_mut().client();
        remem_frontend::cluster_watch::hand_new_nodes(nodes, client, "the cache's client", |address| {
            home.borrow_mut().joined(address)
        });
    })
}
