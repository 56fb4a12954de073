//! One client's ownership of its keys: `clients/NAME/owner` on the session's lease, and
//! `clients/NAME/slabmap` written only with compare-and-swap.
//!
//! Fencing argument. A process writes the slab map only in a transaction that requires both
//! (a) the map's `mod_revision` to be the one this process last read or wrote, and (b) the
//! owner key to be attached to this process's lease. The owner key is created only by a
//! "create if absent" transaction, so at any revision at most one live lease holds it. If this
//! process lost its lease (etcd unreachable longer than the TTL) and another process claimed
//! the name, (b) fails; if the other process also wrote the map, (a) fails too, even should this
//! one claim the key again after the other stopped. Either failure fences this process: it
//! stops and never writes again. A process that lost its lease while nobody else claimed it
//! claims it again (same map revision), so an etcd outage alone fences nobody.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::records::{check_slab_map_size, EndpointRecord, RecordError};
use crate::{with_deadline, ClientName, Connection, Etcd, EtcdError, OwnerRecord};

/// What the keeper and the caller share.
struct Shared {
    /// The lease the owner key is attached to (changes when it is claimed again).
    lease: AtomicI64,
    /// `mod_revision` of the slab map as this process last read or wrote it (0: absent).
    map_revision: Mutex<i64>,
    /// Why this process was fenced, once it was.
    fenced: Mutex<Option<String>>,
    /// The newest map not yet written (the keeper writes it; a newer one replaces it).
    pending: Mutex<Option<Vec<u8>>>,
    wake: tokio::sync::Notify,
    /// One map write at a time, so two writes never race on `map_revision`.
    write_lock: tokio::sync::Mutex<()>,
    /// The endpoint record published, put again on the new lease when the name is claimed again.
    endpoint: Mutex<Option<Vec<u8>>>,
}

/// The owner of one client name. Dropping it writes a pending map (best effort) and revokes the
/// lease, so the name is free at once after a clean stop; after a crash it is free when the
/// lease lapses.
pub struct ClientSession {
    etcd: Etcd,
    owner_key: String,
    map_key: String,
    endpoint_key: String,
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ClientSession {
    /// Claims `name` for `owner`. While another lease holds it (a holder that died leaves its
    /// key until its lease lapses) or etcd does not answer, retries for up to `wait`, then fails.
    ///
    /// Errors: [`EtcdError::Held`] naming the key and its holder; etcd unreachable.
    pub fn claim(
        etcd: &Etcd,
        name: &ClientName,
        owner: &OwnerRecord,
        wait: Duration,
    ) -> Result<ClientSession, EtcdError> {
        let owner_key = etcd.keys.owner(name);
        let deadline = Instant::now() + wait;
        let mut waiting_logged = false;
        let lease = loop {
            match etcd.runtime.block_on(try_claim(&etcd.connection(), &owner_key, owner)) {
                Ok(lease) => break lease,
                Err(EtcdError::Held { key, holder }) if Instant::now() < deadline => {
                    if !waiting_logged {
                        tracing::warn!(%key, %holder, "held by another process: waiting for its lease to lapse");
                        waiting_logged = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
                // A slow or briefly unreachable etcd is retried for as long as a holder would be.
                Err(EtcdError::Timeout { .. } | EtcdError::Etcd { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(error) => return Err(error),
            }
        };
        let shared = Arc::new(Shared {
            lease: AtomicI64::new(lease),
            map_revision: Mutex::new(0),
            fenced: Mutex::new(None),
            pending: Mutex::new(None),
            wake: tokio::sync::Notify::new(),
            write_lock: tokio::sync::Mutex::new(()),
            endpoint: Mutex::new(None),
        });
        let session = Keeper {
            etcd: etcd.connection(),
            owner_key: owner_key.clone(),
            map_key: etcd.keys.slab_map(name),
            endpoint_key: etcd.keys.endpoint(name),
            owner: owner.clone(),
            shared: Arc::clone(&shared),
        };
        let task = etcd.runtime.spawn(session.run());
        Ok(ClientSession {
            etcd: etcd.clone(),
            owner_key,
            map_key: etcd.keys.slab_map(name),
            endpoint_key: etcd.keys.endpoint(name),
            shared,
            task: Some(task),
        })
    }

    /// The saved slab map, if there is one (its size checked; its contents are the caller's to
    /// check). Remembers its revision for the next write.
    pub fn load_map(&self) -> Result<Option<Vec<u8>>, EtcdError> {
        let mut client = self.etcd.client.clone();
        let key = self.map_key.clone();
        let response = self.etcd.block_on(async move { client.get(key, None).await })?;
        let Some(kv) = response.kvs().first() else {
            *lock(&self.shared.map_revision) = 0;
            return Ok(None);
        };
        check_slab_map_size(&self.map_key, kv.value())?;
        *lock(&self.shared.map_revision) = kv.mod_revision();
        Ok(Some(kv.value().to_vec()))
    }

    /// Writes `map` now, with compare-and-swap (module docs).
    ///
    /// Errors: [`EtcdError::Fenced`] (stop: another process owns the map now); etcd unreachable.
    pub fn save_map(&self, map: Vec<u8>) -> Result<(), EtcdError> {
        check_slab_map_size(&self.map_key, &map)?;
        let keeper = self.keeper();
        let result = self.etcd.runtime.block_on(keeper.write_map(Some(map)));
        if let Err(EtcdError::Fenced(reason)) = &result {
            *lock(&self.shared.fenced) = Some(reason.clone());
        }
        result
    }

    /// Deletes the saved map (compare-and-swap, as [`ClientSession::save_map`]).
    pub fn delete_map(&self) -> Result<(), EtcdError> {
        let keeper = self.keeper();
        self.etcd.runtime.block_on(keeper.write_map(None))
    }

    /// Queues `map` to be written in the background (the newest queued map wins), retried
    /// while etcd is unreachable. Never waits for etcd.
    pub fn save_map_in_background(&self, map: Vec<u8>) {
        if let Err(error) = check_slab_map_size(&self.map_key, &map) {
            tracing::error!(%error, "slab map too large for etcd: not saved");
            return;
        }
        *lock(&self.shared.pending) = Some(map);
        self.shared.wake.notify_one();
    }

    /// Publishes where this process serves (`clients/NAME/endpoint`, on the owner lease: it goes
    /// when the process stops or its lease lapses, and is put again if the name is claimed again).
    ///
    /// Errors: an endpoint no one can connect to; the owner key not on this process's lease
    /// (lapsed: the keeper puts it when it claims the name again); etcd unreachable.
    pub fn publish_endpoint(&self, record: &EndpointRecord) -> Result<(), EtcdError> {
        record
            .validate()
            .map_err(|message| RecordError::Invalid { key: self.endpoint_key.clone(), message })?;
        *lock(&self.shared.endpoint) = Some(record.encode());
        self.etcd.runtime.block_on(self.keeper().put_endpoint())
    }

    /// Whether a queued map is still unwritten.
    pub fn map_pending(&self) -> bool {
        lock(&self.shared.pending).is_some()
    }

    /// Why this process was fenced, once it was: it must then stop serving.
    pub fn fenced(&self) -> Option<String> {
        lock(&self.shared.fenced).clone()
    }

    pub fn owner_key(&self) -> &str {
        &self.owner_key
    }

    pub fn map_key(&self) -> &str {
        &self.map_key
    }

    fn keeper(&self) -> Keeper {
        Keeper {
            etcd: self.etcd.connection(),
            owner_key: self.owner_key.clone(),
            map_key: self.map_key.clone(),
            endpoint_key: self.endpoint_key.clone(),
            owner: OwnerRecord { hostname: String::new(), pid: 0, session: 0, started_unix_ms: 0 },
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for ClientSession {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if self.fenced().is_some() {
            return;
        }
        let pending = lock(&self.shared.pending).take();
        let keeper = self.keeper();
        let lease = self.shared.lease.load(Ordering::Relaxed);
        let mut client = self.etcd.client.clone();
        let config = self.etcd.config.clone();
        self.etcd.runtime.block_on(async move {
            if let Some(map) = pending {
                if let Err(error) = keeper.write_map(Some(map)).await {
                    tracing::warn!(%error, "the last slab map was not saved in etcd");
                }
            }
            let _ = with_deadline(&config, client.lease_revoke(lease)).await;
        });
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Grants a lease and creates the owner key on it if absent; returns the lease.
async fn try_claim(etcd: &Connection, owner_key: &str, owner: &OwnerRecord) -> Result<i64, EtcdError> {
    let config = &etcd.config;
    let mut client = etcd.client.clone();
    let lease = with_deadline(config, client.lease_grant(config.lease_ttl_seconds, None)).await?.id();
    let txn = Txn::new()
        .when([Compare::create_revision(owner_key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(owner_key, owner.encode(), Some(PutOptions::new().with_lease(lease)))])
        .or_else([TxnOp::get(owner_key, None)]);
    let response = with_deadline(config, client.txn(txn)).await?;
    if response.succeeded() {
        return Ok(lease);
    }
    let _ = with_deadline(config, client.lease_revoke(lease)).await;
    let held = first_kv(&response.op_responses(), 0);
    let holder =
        match held.as_ref().map(|(value, _, held_lease)| (OwnerRecord::decode(owner_key, value), held_lease))
        {
            // An earlier attempt of this very process won but its answer was lost (a deadline).
            Some((Ok(record), &held_lease)) if record.session == owner.session && held_lease != 0 => {
                return Ok(held_lease);
            }
            Some((Ok(record), _)) => record.to_string(),
            Some((Err(error), _)) => format!("an unreadable owner record: {error}"),
            None => "a process that has just gone".into(),
        };
    Err(EtcdError::Held { key: owner_key.to_owned(), holder })
}

/// The value, mod_revision and lease of the first key of the `index`-th Get of a transaction.
fn first_kv(responses: &[TxnOpResponse], index: usize) -> Option<(Vec<u8>, i64, i64)> {
    match responses.get(index)? {
        TxnOpResponse::Get(get) => {
            get.kvs().first().map(|kv| (kv.value().to_vec(), kv.mod_revision(), kv.lease()))
        }
        _ => None,
    }
}

/// The background half of a session: keeps the lease alive, claims the name again after the
/// lease lapsed, writes queued maps.
struct Keeper {
    etcd: Connection,
    owner_key: String,
    map_key: String,
    endpoint_key: String,
    owner: OwnerRecord,
    shared: Arc<Shared>,
}

impl Keeper {
    async fn run(self) {
        let config = self.etcd.config.clone();
        let mut client = self.etcd.client.clone();
        let mut ticker = tokio::time::interval(config.keep_alive_interval);
        let mut alive: Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)> = None;
        let mut down_logged = false;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = self.shared.wake.notified() => {}
            }
            if lock(&self.shared.fenced).is_some() {
                return;
            }
            let result = self.keep_alive(&mut client, &mut alive).await;
            let result = match result {
                Ok(()) => self.write_pending().await,
                Err(error) => Err(error),
            };
            match result {
                Ok(()) if down_logged => {
                    tracing::info!(key = %self.owner_key, "etcd reachable again: ownership and slab map up to date");
                    down_logged = false;
                }
                Ok(()) => {}
                Err(EtcdError::Fenced(reason)) => {
                    tracing::error!(%reason, "fenced by etcd");
                    *lock(&self.shared.fenced) = Some(reason);
                    return;
                }
                Err(error) => {
                    alive = None;
                    tracing::debug!(key = %self.owner_key, %error, "keeping the session failed");
                    if !down_logged {
                        tracing::warn!(%error, "etcd unreachable: serving on; ownership and the slab map wait for it");
                        down_logged = true;
                    }
                }
            }
        }
    }

    /// One keep-alive of the lease; claims the name again if the lease lapsed.
    async fn keep_alive(
        &self,
        client: &mut etcd_client::Client,
        alive: &mut Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>,
    ) -> Result<(), EtcdError> {
        let config = &self.etcd.config;
        let lease = self.shared.lease.load(Ordering::Relaxed);
        if alive.is_none() {
            match with_deadline(config, client.lease_keep_alive(lease)).await {
                Ok(stream) => *alive = Some(stream),
                // A new keep-alive stream on a lapsed lease fails so (etcd-client checks the
                // first answer's TTL), where an open stream answers with TTL 0.
                Err(EtcdError::Etcd { source: etcd_client::Error::LeaseKeepAliveError(message), .. })
                    if message.contains("lease not found") =>
                {
                    return self.claim_again().await;
                }
                Err(error) => return Err(error),
            }
        }
        let (keeper, responses) = alive.as_mut().expect("set above");
        with_deadline(config, keeper.keep_alive()).await?;
        let response = with_deadline(config, responses.message()).await?;
        if response.is_some_and(|response| response.ttl() > 0) {
            return Ok(());
        }
        *alive = None;
        self.claim_again().await
    }

    /// The lease lapsed: claims the name again on a new one, or is fenced if another process
    /// holds it now.
    async fn claim_again(&self) -> Result<(), EtcdError> {
        match try_claim(&self.etcd, &self.owner_key, &self.owner).await {
            Ok(new_lease) => {
                self.shared.lease.store(new_lease, Ordering::Relaxed);
                tracing::warn!(key = %self.owner_key, "the owner lease had lapsed; claimed again");
                // The endpoint lapsed with the old lease.
                if let Err(error) = self.put_endpoint().await {
                    tracing::warn!(key = %self.endpoint_key, %error, "cannot publish the endpoint again");
                }
                Ok(())
            }
            Err(EtcdError::Held { key, holder }) => Err(EtcdError::Fenced(format!(
                "{key} was claimed by {holder} while this process's lease had lapsed"
            ))),
            Err(error) => Err(error),
        }
    }

    /// Puts the published endpoint record on the current lease, only while the owner key is on
    /// it (a process that lost the name never points clients at itself).
    async fn put_endpoint(&self) -> Result<(), EtcdError> {
        let Some(record) = lock(&self.shared.endpoint).clone() else { return Ok(()) };
        let lease = self.shared.lease.load(Ordering::Relaxed);
        let txn =
            Txn::new().when([Compare::lease(self.owner_key.as_str(), CompareOp::Equal, lease)]).and_then([
                TxnOp::put(self.endpoint_key.as_str(), record, Some(PutOptions::new().with_lease(lease))),
            ]);
        let mut client = self.etcd.client.clone();
        let response = with_deadline(&self.etcd.config, client.txn(txn)).await?;
        if !response.succeeded() {
            return Err(EtcdError::Interrupted(format!(
                "{} is not on this process's lease: the endpoint waits for the name to be claimed again",
                self.owner_key
            )));
        }
        Ok(())
    }

    async fn write_pending(&self) -> Result<(), EtcdError> {
        let Some(map) = lock(&self.shared.pending).take() else { return Ok(()) };
        let result = self.write_map(Some(map.clone())).await;
        if matches!(result, Err(ref error) if !matches!(error, EtcdError::Fenced(_))) {
            // Put it back unless a newer one was queued meanwhile.
            lock(&self.shared.pending).get_or_insert(map);
        }
        result
    }

    /// Writes (`Some`) or deletes (`None`) the map with compare-and-swap (module docs).
    async fn write_map(&self, map: Option<Vec<u8>>) -> Result<(), EtcdError> {
        let _one_writer = self.shared.write_lock.lock().await;
        let config = &self.etcd.config;
        let mut client = self.etcd.client.clone();
        let lease = self.shared.lease.load(Ordering::Relaxed);
        let revision = *lock(&self.shared.map_revision);
        let operation = match map {
            Some(map) => TxnOp::put(self.map_key.as_str(), map, None),
            None => TxnOp::delete(self.map_key.as_str(), None),
        };
        let txn = Txn::new()
            .when([
                Compare::mod_revision(self.map_key.as_str(), CompareOp::Equal, revision),
                Compare::lease(self.owner_key.as_str(), CompareOp::Equal, lease),
            ])
            .and_then([operation])
            .or_else([TxnOp::get(self.map_key.as_str(), None), TxnOp::get(self.owner_key.as_str(), None)]);
        let response = with_deadline(config, client.txn(txn)).await?;
        if response.succeeded() {
            let written = matches!(response.op_responses().first(), Some(TxnOpResponse::Put(_)));
            let new_revision =
                if written { response.header().map_or(0, |header| header.revision()) } else { 0 };
            *lock(&self.shared.map_revision) = new_revision;
            return Ok(());
        }
        let responses = response.op_responses();
        let map_now = first_kv(&responses, 0).map_or(0, |(_, mod_revision, _)| mod_revision);
        if map_now != revision {
            return Err(EtcdError::Fenced(format!(
                "{} was written by another process (revision {map_now}, this process knew {revision})",
                self.map_key
            )));
        }
        match first_kv(&responses, 1) {
            None => Err(EtcdError::Interrupted(format!("{} lapsed; claiming it again", self.owner_key))),
            Some((value, _, _)) => {
                let holder = OwnerRecord::decode(&self.owner_key, &value)
                    .map(|record| record.to_string())
                    .unwrap_or_else(|error| format!("an unreadable owner record: {error}"));
                Err(EtcdError::Fenced(format!("{} is held by {holder}", self.owner_key)))
            }
        }
    }
}
