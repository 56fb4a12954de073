//! `remem kv`'s state directory: what a restarted server needs to find its items again
//! (docs/KV.md "Restarts").
//!
//! `kv-NAME/` beside the cluster file (or `--state DIR`), mode 0700, holds `lock` (flock: one
//! server at a time), `slabmap.json` (the regions' slabs, every region), `backup` (the
//! backup region the server records every acknowledged item in, `crate::backup`) and
//! `rewrites` (chunk page rewrites that a kill may have cut short, `crate::cache::rewrites`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use remem_client::{Client, ClientConfig, SlabMapFile};
use remem_frontend::state_dir::{LockError, LockedDir};

use crate::backup::Backup;
use crate::cache::durability::RestoreReport;
use crate::cache::rewrites::{Intent, RewriteLog};
use crate::cache::CacheConfig;
use crate::Cache;

pub const SLAB_MAP_FILE: &str = "slabmap.json";
pub const BACKUP_FILE: &str = "backup";
pub const REWRITES_FILE: &str = "rewrites";

/// Where a reopening's time went.
pub struct ReopenTimes {
    /// The client reopened on its saved slabs (every node connected, leases re-attached).
    pub slabs: std::time::Duration,
    /// The backup region mapped and scanned (every slot's CRC checked, records decoded).
    pub scan: std::time::Duration,
    /// Records checked against each other and the regions; index and allocators rebuilt.
    pub restore: std::time::Duration,
}

/// A locked state directory.
pub struct KvState {
    pub dir: PathBuf,
    _lock: LockedDir,
}

impl KvState {
    /// Creates (0700) and locks `dir` (remem-frontend's `LockedDir`, as `remem fs` does); errors when
    /// another process holds it.
    pub fn lock(dir: &Path) -> Result<KvState> {
        match LockedDir::open(dir) {
            Ok(lock) => Ok(KvState { dir: dir.to_owned(), _lock: lock }),
            Err(LockError::Locked { holder, .. }) => bail!(
                "state directory {} is in use by another remem kv (pid {holder}); stop it first, or give \
                 this one another --name",
                dir.display()
            ),
            Err(error) => Err(error.into()),
        }
    }

    pub fn map_path(&self) -> PathBuf {
        self.dir.join(SLAB_MAP_FILE)
    }

    pub fn backup_path(&self) -> PathBuf {
        self.dir.join(BACKUP_FILE)
    }

    /// The rewrites file, opened (created when absent), with the intents it holds.
    pub fn open_rewrites(&self) -> Result<(RewriteLog, Vec<Intent>)> {
        let path = self.dir.join(REWRITES_FILE);
        RewriteLog::open(&path).with_context(|| format!("opening {}", path.display()))
    }

    /// Gives back a saved server's slabs and forgets its items (`--fresh`).
    pub fn drop_saved(&self, secret: &remem_client::Secret, config: &ClientConfig) -> Result<()> {
        let map_path = self.map_path();
        if map_path.exists() {
            match SlabMapFile::load(&map_path) {
                Ok(map) => {
                    if let Err(error) = Client::release_saved(&map, secret, config.clone()) {
                        tracing::warn!(%error, "cannot reach the saved server's slabs to unmap them");
                    }
                }
                Err(error) => tracing::warn!(%error, "ignoring an unreadable saved slab map"),
            }
            std::fs::remove_file(&map_path).with_context(|| format!("removing {}", map_path.display()))?;
        }
        for path in [self.backup_path(), self.dir.join(REWRITES_FILE)] {
            if path.exists() {
                std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            }
        }
        Ok(())
    }

    /// The saved server, reopened: its client (every region), its cache with every item its
    /// backup region holds. None when nothing is saved.
    pub fn reopen(
        &self,
        cluster: &remem_client::cluster::ClusterFile,
        cluster_path: &Path,
        secret: &remem_client::Secret,
        config: ClientConfig,
        cache_config: CacheConfig,
    ) -> Result<Option<(Cache, RestoreReport, ReopenTimes)>> {
        let map_path = self.map_path();
        if !map_path.exists() {
            return Ok(None);
        }
        let map = SlabMapFile::load(&map_path)?;
        remem_frontend::cluster_file::check_saved_on_cluster(
            &map,
            cluster,
            cluster_path,
            secret,
            &format!("the cache state in {}", self.dir.display()),
        )?;
        if !map.fits(config.address_space_bytes, &config.shape) {
            bail!(
                "{} holds {}: pass its -m, -k and -r, or --fresh to drop its items and start empty",
                map_path.display(),
                map_mismatch(&map, &config)
            );
        }
        let started = std::time::Instant::now();
        let client = Client::reopen(&map, secret, config)
            .with_context(|| format!("reopening the slabs saved in {}", map_path.display()))?;
        let mut cache = crate::cache::open::cache_over_regions(client, cache_config).map_err(|message| {
            anyhow::anyhow!(
                "{}: {message}; start with the flags it was saved with (--scheme, --prefix-scheme, \
                 --small-scheme, --large-scheme, -k, -r), or --fresh",
                map_path.display()
            )
        })?;
        cache.set_map_path(map_path.clone());
        // Pages whose rewrite a kill cut short are whole again before anything reads them.
        self.complete_cut_rewrites(&mut cache)?;
        let slabs = started.elapsed();
        let backup_path = self.backup_path();
        let (backup, records, scan) = Backup::open(&backup_path).context(
            "the slab map is saved but its backup region is not readable; --fresh starts empty (the \
             items are lost either way)",
        )?;
        let scanned = started.elapsed();
        cache.set_backup(backup);
        let report = cache.restore(records, scan, crate::clock::now_unix());
        let times = ReopenTimes { slabs, scan: scanned - slabs, restore: started.elapsed() - scanned };
        Ok(Some((cache, report, times)))
    }

    /// A new backup region of `bytes`, for a server that starts empty.
    /// Completes the chunk page rewrites the rewrites log says a kill cut short, saying so.
    pub fn complete_cut_rewrites(&self, cache: &mut crate::Cache) -> Result<()> {
        let (log, intents) = self.open_rewrites()?;
        let recovered = cache.recover_rewrites(log, intents);
        if recovered.pages + recovered.failed > 0 {
            eprintln!(
                "completed {} chunk page rewrites cut short by the last stop ({} could not be)",
                recovered.pages, recovered.failed
            );
        }
        Ok(())
    }

    pub fn create_backup(&self, bytes: u64) -> Result<Backup> {
        Ok(Backup::create(&self.backup_path(), bytes)?)
    }
}

/// The default backup region size: room for every item a memory limit allows (a record is at
/// most about twice the bytes its item counts), plus a chunk per size class.
pub fn default_backup_bytes(memory_limit: u64) -> u64 {
    memory_limit.saturating_mul(5) / 2 + (16 << 20)
}

/// How a saved map differs from what `config` would open: "a kv of SIZE at EC(k,r), not ...".
pub(super) fn map_mismatch(map: &remem_client::SlabMapFile, config: &ClientConfig) -> String {
    format!(
        "a kv of {} at EC({},{}), not {} at EC({},{})",
        remem_frontend::units::format_bytes(map.address_space_bytes),
        map.data_splits,
        map.parity_splits,
        remem_frontend::units::format_bytes(config.address_space_bytes),
        config.shape.data_splits,
        config.shape.parity_splits
    )
}
