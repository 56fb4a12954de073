//! `--transport`: how a command's client reaches the nodes' memory: TCP, or shared memory with
//! the nodes on this host (docs/SHM.md). Beside it each front end takes `--encrypt`
//! (`ClientConfig::encrypt`): its TCP connections are encrypted, for nodes run with `--encrypt`.

/// TCP to every node, or shared memory for the nodes on this host (TCP for the others).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Transport {
    Tcp,
    Shm,
}

/// `--transport shm` needs nodes with a Unix socket: refused, saying so, when none has one.
pub fn check_transport(
    transport: Transport,
    cluster: &remem_client::cluster::ClusterFile,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    if transport == Transport::Shm && cluster.nodes.iter().all(|node| node.unix_socket.is_none()) {
        anyhow::bail!(
            "--transport shm: no node of {} has a Unix socket (nodes started by `remem up` have one; \
             `remem node --unix PATH` gives one), so there is no shared memory to use",
            path.display()
        );
    }
    Ok(())
}
