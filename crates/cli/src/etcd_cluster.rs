//! etcd from the cli's side (`--etcd`, docs/ETCD.md): a node's registration
//! ([`register_node`], `remem node --etcd`) and `remem status --etcd` ([`status`]). What a front
//! end asks of etcd or of a cluster file (`--etcd` flags, `ExportHome`, `FileHome`, `EtcdHome`,
//! `open_export`) is remem-frontend's `export_home`, re-exported here under the path the tests
//! have always used.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use remem_etcd::{Etcd, NodeRecord};

pub use remem_frontend::export_home::{
    open_export, Endpoints, EtcdArgs, EtcdExportRequest, EtcdHome, ExportHome, FileHome,
};

/// Registers a node in etcd for as long as the returned registration lives (module docs of
/// remem-etcd's `registration`): its record is rewritten from `handle` every few seconds.
///
/// Errors: the record the node would write fails its own checks (e.g. `address` is 0.0.0.0).
pub fn register_node(
    etcd: &Etcd,
    handle: remem_node::NodeHandle,
    address: SocketAddr,
    unix_socket: Option<PathBuf>,
) -> Result<remem_etcd::NodeRegistration> {
    let hostname = remem_etcd::hostname();
    let record = move || {
        let info = handle.info();
        NodeRecord {
            address,
            unix_socket: unix_socket.clone(),
            hostname: hostname.clone(),
            failure_domain: info.failure_domain,
            node_id: info.node_id,
            capacity_bytes: info.capacity_bytes,
            free_bytes: info.free_bytes,
            slab_size_bytes: info.slab_size_bytes,
            slabs_mapped: info.slabs_mapped,
            rebuilds_running: info.regenerating_slabs,
            clients_live: info.clients_live,
            updated_unix_ms: remem_etcd::unix_ms(),
        }
    };
    let first = record.clone();
    if let Err(message) = first().validate() {
        bail!("cannot register in etcd: {message} (listen on the address clients should use)");
    }
    Ok(remem_etcd::NodeRegistration::start(etcd, record))
}

/// `remem status --etcd`: the registered nodes, asked live when `live` gives the secret (and
/// how to ask each node), else as their records say (refreshed every few seconds by each node;
/// a node is listed while its lease lives).
pub fn status(
    etcd: &Etcd,
    live: Option<(&remem_client::Secret, crate::status_command::Ask)>,
) -> Result<crate::status_command::ClusterStatus> {
    let records = etcd.nodes().context("reading the nodes registered in etcd")?;
    let nodes: Vec<crate::status_command::NodeRow> = match live {
        Some((secret, ask)) => {
            let targets: Vec<(SocketAddr, String)> =
                records.iter().map(|node| (node.address, node.failure_domain.clone())).collect();
            crate::status_command::ask_nodes(&targets, secret, ask)
        }
        None => records_as_rows(&records),
    };
    Ok(crate::status_command::ClusterStatus {
        cluster_file: format!("etcd {} ({})", etcd.keys().nodes(), etcd.config().endpoints.join(",")),
        nodes_up: nodes.iter().filter(|node| node.up).count(),
        capacity_bytes: nodes.iter().map(|node| node.capacity_bytes).sum(),
        free_bytes: nodes.iter().map(|node| node.free_bytes).sum(),
        rebuilds_running: nodes.iter().map(|node| node.rebuilds_running).sum(),
        nodes,
        clients: Vec::new(),
    })
}

/// The records as status rows: every registered node is up as far as etcd knows.
fn records_as_rows(records: &[NodeRecord]) -> Vec<crate::status_command::NodeRow> {
    records
        .iter()
        .enumerate()
        .map(|(index, node)| crate::status_command::NodeRow {
            index,
            address: node.address.to_string(),
            failure_domain: node.failure_domain.clone(),
            up: true,
            error: None,
            capacity_bytes: node.capacity_bytes,
            used_bytes: node.capacity_bytes - node.free_bytes,
            free_bytes: node.free_bytes,
            slab_size_bytes: node.slab_size_bytes,
            slabs_mapped: node.slabs_mapped,
            requests_served: 0,
            rebuilds_running: node.rebuilds_running,
            rebuild_percent: None,
            rebuild_pages_per_second: None,
            rebuild_eta_seconds: None,
            rebuild_sample: None,
            clients: node.clients_live,
            clients_in_grace: 0,
            slabs_in_grace: 0,
        })
        .collect()
}
