//! Following the node membership: a background task reads `nodes/` once, then watches it from
//! the next revision, and keeps a snapshot that callers read without waiting for etcd.
//!
//! When etcd goes away the snapshot stays as it was (membership changes wait); the task reads
//! the whole prefix again when it is back, so changes made meanwhile are not missed even if the
//! watch's history was compacted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions};

use crate::{with_deadline, Connection, Etcd, EtcdError, Keys, NodeRecord};

/// How long the task waits before reading etcd again after a failure.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// The valid node records among `kvs`, by key address; invalid ones are logged and skipped.
pub(crate) fn decode_nodes(keys: &Keys, kvs: &[KeyValue]) -> BTreeMap<String, NodeRecord> {
    let mut nodes = BTreeMap::new();
    for kv in kvs {
        if let Some((address, record)) = decode_node(keys, kv) {
            nodes.insert(address, record);
        }
    }
    nodes
}

fn decode_node(keys: &Keys, kv: &KeyValue) -> Option<(String, NodeRecord)> {
    let key = String::from_utf8_lossy(kv.key()).into_owned();
    let address = keys.node_address(&key)?.to_owned();
    match NodeRecord::decode(&key, &address, kv.value()) {
        Ok(record) => Some((address, record)),
        Err(error) => {
            tracing::warn!(%error, "skipping an invalid node record in etcd");
            None
        }
    }
}

/// The membership as etcd last said it. Dropping it stops the watch.
pub struct MembershipWatch {
    nodes: Arc<Mutex<BTreeMap<String, NodeRecord>>>,
    connected: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl MembershipWatch {
    /// Starts following `nodes/` in the background; the first snapshot is `initial` (what
    /// the caller read with [`Etcd::nodes`]), so there is no window with an empty membership.
    pub fn start(etcd: &Etcd, initial: &[NodeRecord]) -> MembershipWatch {
        let snapshot = initial.iter().map(|node| (node.address.to_string(), node.clone())).collect();
        let nodes = Arc::new(Mutex::new(snapshot));
        let connected = Arc::new(AtomicBool::new(false));
        let task =
            etcd.runtime.spawn(follow_forever(etcd.connection(), Arc::clone(&nodes), Arc::clone(&connected)));
        MembershipWatch { nodes, connected, task }
    }

    /// The nodes registered now (as of the last event seen), by address.
    pub fn nodes(&self) -> Vec<NodeRecord> {
        self.nodes.lock().map(|nodes| nodes.values().cloned().collect()).unwrap_or_default()
    }

    /// Whether the watch is running (etcd reachable at its last read).
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }
}

impl Drop for MembershipWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn follow_forever(
    etcd: Connection,
    nodes: Arc<Mutex<BTreeMap<String, NodeRecord>>>,
    connected: Arc<AtomicBool>,
) {
    let mut down_logged = false;
    loop {
        let error = follow(&etcd, &nodes, &connected, &mut down_logged).await;
        connected.store(false, Ordering::Relaxed);
        if !down_logged {
            tracing::warn!(%error, "lost the etcd membership watch: keeping the nodes known, retrying");
            down_logged = true;
        }
        tokio::time::sleep(RETRY_INTERVAL).await;
    }
}

/// Reads the membership, then applies watch events until the watch fails; returns why.
async fn follow(
    etcd: &Connection,
    nodes: &Mutex<BTreeMap<String, NodeRecord>>,
    connected: &AtomicBool,
    down_logged: &mut bool,
) -> EtcdError {
    let mut client = etcd.client.clone();
    let prefix = etcd.keys.nodes();
    let response =
        match with_deadline(&etcd.config, client.get(prefix.clone(), Some(GetOptions::new().with_prefix())))
            .await
        {
            Ok(response) => response,
            Err(error) => return error,
        };
    let revision = response.header().map_or(0, |header| header.revision());
    let read = decode_nodes(&etcd.keys, response.kvs());
    if let Ok(mut nodes) = nodes.lock() {
        *nodes = read;
    }
    let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
    let mut stream = match with_deadline(&etcd.config, client.watch(prefix, Some(options))).await {
        Ok(stream) => stream,
        Err(error) => return error,
    };
    connected.store(true, Ordering::Relaxed);
    if *down_logged {
        tracing::info!("etcd membership watch running again");
        *down_logged = false;
    }
    let endpoints = etcd.config.endpoints.join(",");
    loop {
        let response = match stream.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return EtcdError::Interrupted("the watch stream ended".into()),
            Err(source) => return EtcdError::Etcd { endpoints, source },
        };
        if response.canceled() {
            return EtcdError::Interrupted(format!("the watch was cancelled: {}", response.cancel_reason()));
        }
        let Ok(mut nodes) = nodes.lock() else {
            return EtcdError::Interrupted("membership lock poisoned".into());
        };
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let Some(address) = etcd.keys.node_address(&key) else { continue };
            match event.event_type() {
                EventType::Put => {
                    if let Some((address, record)) = decode_node(&etcd.keys, kv) {
                        nodes.insert(address, record);
                    }
                }
                EventType::Delete => {
                    if nodes.remove(address).is_some() {
                        tracing::info!(
                            node = address,
                            "node left etcd's membership (lease lapsed or stopped)"
                        );
                    }
                }
            }
        }
    }
}
