//! Fault injection from the outside: tell a node (started with `--fault-injection`) to delay
//! its replies, flip bits in a slab, or evict a slab. Used by the fault suite and
//! `remem bench pages --straggler`.
//!
//! Corrupt and evict act on a slab of the client id given, which must own it: a test uses the
//! id of the client under test.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use remem_proto::auth::Secret;
use remem_proto::{Control, FaultKind};

/// One fault to inject.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Hold back a fraction (parts per million) of the node's replies by `delay_us`.
    Delay { delay_us: u32, fraction_ppm: u32, seed: u64 },
    /// Flip `flips` random bits in written slots of a slab.
    Corrupt { slab_id: u32, flips: u32, seed: u64 },
    /// Evict a slab: the owner is told, then the slab is unmapped.
    Evict { slab_id: u32 },
    /// Remove delays.
    Clear,
}

impl Fault {
    fn message(self) -> Control {
        let (fault, slab_id, delay_us, fraction_ppm, flips, seed) = match self {
            Fault::Delay { delay_us, fraction_ppm, seed } => {
                (FaultKind::Delay, 0, delay_us, fraction_ppm, 0, seed)
            }
            Fault::Corrupt { slab_id, flips, seed } => (FaultKind::Corrupt, slab_id, 0, 0, flips, seed),
            Fault::Evict { slab_id } => (FaultKind::Evict, slab_id, 0, 0, 0, 0),
            Fault::Clear => (FaultKind::ClearFaults, 0, 0, 0, 0, 0),
        };
        Control::InjectFault { fault, slab_id, delay_us, fraction_ppm, flips, seed }
    }
}

/// Connects to `address` as `client_id`, injects `fault`, waits for the node's `Ok`.
pub fn inject(address: SocketAddr, secret: &Secret, client_id: u64, fault: Fault) -> Result<()> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))
        .with_context(|| format!("connecting to {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    remem_proto::blocking::handshake(&mut stream, secret, client_id)
        .map_err(|error| anyhow::anyhow!("handshake with {address}: {error}"))?;
    remem_proto::blocking::write_control(&mut stream, 7, &fault.message())?;
    let mut body = Vec::new();
    let reply = loop {
        let (_, reply) = remem_proto::blocking::read_control(&mut stream, &mut body)
            .map_err(|error| anyhow::anyhow!("reading the reply of {address}: {error}"))?;
        // This connection belongs to the slab's owner too, so an eviction notice comes first.
        if !matches!(reply, Control::SlabEvicted { .. }) {
            break reply;
        }
    };
    match reply {
        Control::Ok => Ok(()),
        Control::Error { code, message } => bail!("{address} refused {fault:?}: {code}: {message}"),
        other => bail!("{address} answered {fault:?} with {:?}", other.kind()),
    }
}
