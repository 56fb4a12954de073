//! A memory node's registration: its record under `nodes/ADDRESS` on a lease of
//! [`EtcdConfig::lease_ttl_seconds`](crate::EtcdConfig), kept alive and rewritten (free
//! memory, slabs, rebuilds) every [`EtcdConfig::keep_alive_interval`](crate::EtcdConfig).
//!
//! The node serves whatever etcd does: a failure is logged once, the task retries every second
//! and logs again when the node is registered anew. A node that dies leaves its key for at most
//! one lease; a node that stops cleanly revokes its lease, so it leaves the membership at once.

use std::time::Duration;

use etcd_client::PutOptions;
use tokio::sync::watch;

use crate::{with_deadline, Connection, Etcd, EtcdError, NodeRecord};

const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Keeps a node registered until dropped (which revokes the lease, within one request deadline).
pub struct NodeRegistration {
    etcd: Etcd,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl NodeRegistration {
    /// Starts registering in the background; `record` is called for each write, so the record
    /// carries the node's current free memory, slabs and rebuilds. Returns at once, whether
    /// or not etcd is reachable.
    pub fn start(etcd: &Etcd, record: impl FnMut() -> NodeRecord + Send + 'static) -> NodeRegistration {
        let (stop, stopped) = watch::channel(false);
        let task = etcd.runtime.spawn(register_forever(etcd.connection(), record, stopped));
        NodeRegistration { etcd: etcd.clone(), stop, task: Some(task) }
    }
}

impl Drop for NodeRegistration {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            // The task revokes the lease as it stops; wait for that, bounded by its deadline.
            let deadline = self.etcd.config.request_timeout + Duration::from_millis(500);
            let _ = self.etcd.runtime.block_on(async { tokio::time::timeout(deadline, task).await });
        }
    }
}

async fn register_forever(
    etcd: Connection,
    mut record: impl FnMut() -> NodeRecord + Send,
    mut stopped: watch::Receiver<bool>,
) {
    let mut down_logged = false;
    loop {
        match registered(&etcd, &mut record, &mut stopped, &mut down_logged).await {
            Ok(()) => return,
            Err(error) => {
                if !down_logged {
                    tracing::warn!(%error, "cannot register in etcd: serving on, retrying every second");
                    down_logged = true;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY_INTERVAL) => {}
            _ = stopped.changed() => return,
        }
    }
}

/// One registration: grant a lease, write the record, keep both fresh until stopped (Ok, the
/// lease revoked) or until etcd fails (Err).
async fn registered(
    etcd: &Connection,
    record: &mut (impl FnMut() -> NodeRecord + Send),
    stopped: &mut watch::Receiver<bool>,
    down_logged: &mut bool,
) -> Result<(), EtcdError> {
    let config = &etcd.config;
    let mut client = etcd.client.clone();
    let lease = with_deadline(config, client.lease_grant(config.lease_ttl_seconds, None)).await?.id();
    let (mut keeper, mut responses) = with_deadline(config, client.lease_keep_alive(lease)).await?;
    let first = record();
    let key = etcd.keys.node(first.address);
    let put = |client: &mut etcd_client::Client, value: Vec<u8>| {
        let key = key.clone();
        let mut client = client.clone();
        async move { client.put(key, value, Some(PutOptions::new().with_lease(lease))).await }
    };
    with_deadline(config, put(&mut client, first.encode())).await?;
    if *down_logged {
        tracing::info!(%key, "registered in etcd again");
        *down_logged = false;
    } else {
        tracing::info!(%key, "registered in etcd");
    }
    let mut ticker = tokio::time::interval(config.keep_alive_interval);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stopped.changed() => {
                let _ = with_deadline(config, client.lease_revoke(lease)).await;
                return Ok(());
            }
        }
        with_deadline(config, keeper.keep_alive()).await?;
        let response = with_deadline(config, responses.message()).await?;
        if response.is_none_or(|response| response.ttl() <= 0) {
            return Err(EtcdError::Interrupted(format!("lease {lease:#x} of {key} lapsed")));
        }
        with_deadline(config, put(&mut client, record().encode())).await?;
    }
}
