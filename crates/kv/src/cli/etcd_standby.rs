//! `remem kv --etcd --standby` (docs/KV.md "Standby on another host"): a standby on any host
//! waits while the primary holds the kv's name in etcd, and when the primary's owner lease lapses
//! claims the name and opens the kv exactly as a `remem kv --etcd` start does (reading the state
//! region back), then serves. `--takeover-command` (here too) tells the network the new server
//! is up.
//!
//! Safety: the standby never serves while another process holds the name: it claims the name
//! with etcd's "create if absent" on its own lease (remem-frontend `claim_export`), so of the
//! primary and any number of standbys one holds it at a time, and the nodes refuse a second
//! session of the kv's client id while the old one's connections live (a primary whose host
//! vanished is waited for until the nodes' `--lease-timeout` closes them). Everything read from
//! etcd is checked before use: the owner record (`OwnerRecord::decode`) and the saved slab map
//! (`decode_map`, then `fits` this standby's -m, -k and -r: a standby that could not open the
//! primary's kv is refused at once, not at the takeover).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use remem_client::ClientConfig;
use remem_etcd::{ClientName, Etcd, EtcdError, OwnerRecord};
use remem_frontend::export_home::{claim_export_within, decode_map, ClaimedExport};

/// How often a standby reads the owner key: a lapsed primary is taken over within this (one
/// small read per interval).
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// How often a waiting standby says what it waits for.
const SAY_INTERVAL: Duration = Duration::from_secs(5);

/// The name, claimed by a standby once its primary's lease lapsed.
pub struct Takeover {
    pub claimed: ClaimedExport,
    /// When the standby found the name free.
    pub free_at: Instant,
    /// The last holder it saw (None: the name was free from the start).
    pub primary: Option<OwnerRecord>,
}

/// Waits until `export` is free in etcd, then claims it. Returns None when `stop` is set
/// (SIGTERM) first.
///
/// Errors: a saved slab map this standby could not open (its -m, -k or -r differ, or the map
/// does not decode); an owner record that does not decode; a claim that fails for another reason
/// than a holder or an unreachable etcd.
pub fn wait_and_claim(
    etcd: &Etcd,
    export: &str,
    config: &ClientConfig,
    stop: &AtomicBool,
) -> Result<Option<Takeover>> {
    let name = ClientName::new(export).context("--export names the kv's keys in etcd")?;
    let ttl = etcd.config().lease_ttl_seconds;
    let mut primary: Option<OwnerRecord> = None;
    let mut said: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let owner = match etcd.owner(&name) {
            Ok(owner) => owner,
            Err(error @ EtcdError::Record(_)) => {
                bail!("kv {export:?} has an owner record this standby cannot read: {error}")
            }
            Err(error) => {
                if said.is_none_or(|at| at.elapsed() >= SAY_INTERVAL) {
                    eprintln!("standing by for kv {export:?}: etcd does not answer ({error}); waiting");
                    said = Some(Instant::now());
                }
                std::thread::sleep(POLL_INTERVAL);
                continue;
            }
        };
        let Some(holder) = owner else {
            let free_at = Instant::now();
            match claim_export_within(etcd.clone(), export, Duration::from_millis(500)) {
                Ok(claimed) => return Ok(Some(Takeover { claimed, free_at, primary })),
                Err(error) if retry_claim(&error) => {
                    tracing::info!(error = %format!("{error:#}"), "the name was taken first: standing by again");
                    continue;
                }
                Err(error) => return Err(error.context(format!("taking over kv {export:?}"))),
            }
        };
        let new_holder = primary.as_ref().is_none_or(|seen| seen.session != holder.session);
        if new_holder {
            check_saved_map(etcd, &name, config)?;
        }
        if new_holder || said.is_none_or(|at| at.elapsed() >= SAY_INTERVAL) {
            eprintln!(
                "standing by for kv {export:?}, held by {holder}: taking over when its owner lease ({ttl} s) lapses"
            );
            said = Some(Instant::now());
        }
        primary = Some(holder);
        std::thread::sleep(POLL_INTERVAL);
    }
    Ok(None)
}

/// A claim that lost a race (another standby, or the primary claiming again) or met an etcd
/// that did not answer: stand by again.
fn retry_claim(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<EtcdError>(),
            Some(EtcdError::Held { .. } | EtcdError::Timeout { .. } | EtcdError::Etcd { .. })
        )
    })
}

/// Refuses a standby whose -m, -k and -r could not open the saved kv.
fn check_saved_map(etcd: &Etcd, name: &ClientName, config: &ClientConfig) -> Result<()> {
    let key = etcd.keys().slab_map(name);
    let Some(bytes) = etcd.slab_map(name).with_context(|| format!("reading {key}"))? else {
        return Ok(());
    };
    let map = decode_map(&key, &bytes)?;
    if !map.fits(config.address_space_bytes, &config.shape) {
        bail!(
            "standby refused: {key} holds {}: pass the primary's -m, -k and -r",
            super::state::map_mismatch(&map, config)
        );
    }
    Ok(())
}

/// Whether opening the kv failed because a node still holds the old primary's session of the
/// client id (its host vanished: the node closes that session after its `--lease-timeout`).
pub fn old_session_lives(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<remem_client::ConnectError>(),
            Some(remem_client::ConnectError::ClientIdInUse { .. })
        )
    })
}

/// What a standby that took over says.
pub fn took_over(export: &str, takeover_primary: Option<&OwnerRecord>, free_at: Instant) -> String {
    let from = takeover_primary.map(|primary| format!(" from {primary}")).unwrap_or_default();
    format!(
        "took over kv {export:?}{from} (its owner lease lapsed): serving {} ms after the name was free",
        free_at.elapsed().as_millis()
    )
}

/// Runs `--takeover-command` with `sh -c` once this process serves (as keepalived's notify
/// scripts): `REMEM_KV_ADDRESS` and `REMEM_KV_NAME` in its environment. Its exit is logged
/// from a thread of its own; the server never waits for it.
pub fn run_takeover_command(command: &str, address: SocketAddr, name: &str) {
    let spawned = std::process::Command::new("sh")
        .args(["-c", command])
        .env("REMEM_KV_ADDRESS", address.to_string())
        .env("REMEM_KV_NAME", name)
        .stdin(std::process::Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            tracing::error!(%error, command, "cannot run the takeover command");
            return;
        }
    };
    let command = command.to_owned();
    std::thread::spawn(move || match child.wait() {
        Ok(status) if status.success() => eprintln!("takeover command done: {command}"),
        Ok(status) => tracing::error!(%status, command, "the takeover command failed"),
        Err(error) => tracing::error!(%error, command, "cannot wait for the takeover command"),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_race_or_a_silent_etcd_stands_by_again_and_anything_else_stops() {
        let held = EtcdError::Held { key: "k".into(), holder: "pid 1".into() };
        assert!(retry_claim(&anyhow::Error::new(held).context("claiming the export in etcd")));
        let timeout = EtcdError::Timeout { endpoints: "e".into(), timeout: Duration::from_secs(5) };
        assert!(retry_claim(&anyhow::Error::new(timeout)));
        let record =
            EtcdError::Record(remem_etcd::RecordError::Parse { key: "k".into(), message: "x".into() });
        assert!(!retry_claim(&anyhow::Error::new(record)));
        assert!(!retry_claim(&anyhow::anyhow!("a saved map that does not decode")));
    }

    #[test]
    fn only_a_node_holding_the_old_session_is_retried() {
        let in_use = remem_client::ConnectError::ClientIdInUse {
            address: "10.0.0.1:7100".parse().unwrap(),
            client_id: 7,
            message: "held".into(),
        };
        assert!(old_session_lives(&anyhow::Error::new(in_use).context("reopening the slabs saved in etcd")));
        let too_few = remem_client::ConnectError::TooFewNodes { needed: 6, given: 2 };
        assert!(!old_session_lives(&anyhow::Error::new(too_few)));
    }
}
