//! The open connections of a node, so that a thread other than a connection's own can write to
//! it: eviction notices (`SlabEvicted`) go to every connection of the slab's owner, and a rebuild
//! reports `RegenerationDone` on the connection that asked for it.
//!
//! Invariant: every write to a connection's socket, by its own thread or another, happens under
//! that connection's `writer` lock and writes whole frames, so frames never interleave mid-frame.
//! On an encrypted connection the sending half of its cipher lives under that lock too, so
//! frames are sealed in the order they go out, whichever thread sends them.
//! A connection blocked in `read` still gets its notices promptly, because the writer is the
//! notifying thread itself.

use crate::stream::Stream;
use remem_proto::encryption::{Sealer, MAX_PLAINTEXT_BYTES};
use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// One open connection, as seen from other threads.
pub struct Peer {
    /// A clone of the connection's socket: shut down to stop it, written to for notices.
    pub stream: Stream,
    client_id: AtomicU64,
    authenticated: AtomicBool,
    /// The client volunteered this connection for `SlabActivityQuery` (`AnswerActivity`).
    answers_activity: AtomicBool,
    writer: Mutex<Outbound>,
}

/// Plaintext, or the sending half of the connection's cipher and the buffer it seals into (kept,
/// so sealing allocates nothing once it has its size: at most [`SEAL_CHUNK_BYTES`] and a tag per
/// message).
#[derive(Default)]
pub struct Outbound {
    sealer: Option<Sealer>,
    sealed: Vec<u8>,
}

/// Plaintext sealed and written at once: four whole messages. The node writes its output in one
/// `write` of up to 256 KiB; encrypted, one `write` per four messages bounds the sealed copy.
const SEAL_CHUNK_BYTES: usize = 4 * MAX_PLAINTEXT_BYTES;

impl Peer {
    pub fn new(stream: Stream) -> Peer {
        Peer {
            stream,
            client_id: AtomicU64::new(0),
            authenticated: AtomicBool::new(false),
            answers_activity: AtomicBool::new(false),
            writer: Mutex::new(Outbound::default()),
        }
    }

    /// Records the authenticated client id; from now on notices for it reach this connection.
    pub fn authenticated(&self, client_id: u64) {
        self.client_id.store(client_id, Ordering::Relaxed);
        self.authenticated.store(true, Ordering::Release);
    }

    pub fn volunteer_for_activity(&self) {
        self.answers_activity.store(true, Ordering::Relaxed);
    }

    fn client_id(&self) -> Option<u64> {
        self.authenticated.load(Ordering::Acquire).then(|| self.client_id.load(Ordering::Relaxed))
    }

    /// Held while writing whole frames to the socket.
    pub fn lock_writes(&self) -> MutexGuard<'_, Outbound> {
        // The cipher's nonce moves only with a whole sealed message, and a write that failed
        // ends the connection: poisoning is no reason to stop.
        self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// From now on every write is sealed (the encryption handshake just ended, before any
    /// other thread can write: notices go only to authenticated connections).
    pub fn start_encrypting(&self, sealer: Sealer) {
        self.lock_writes().sealer = Some(sealer);
    }

    /// Writes whole frames, sealed if the connection encrypts, under the write lock. With
    /// `authenticated`, records the connection as that client's first ([`Peer::authenticated`]),
    /// under the lock: it counts toward the limit before the peer reads `AuthOk`, and a notice
    /// for the client cannot go out before it.
    pub fn write_frames(&self, frames: &[u8], authenticated: Option<u64>) -> io::Result<()> {
        let mut outbound = self.lock_writes();
        if let Some(client_id) = authenticated {
            self.authenticated(client_id);
        }
        let Outbound { sealer, sealed } = &mut *outbound;
        let Some(sealer) = sealer else {
            return (&self.stream).write_all(frames);
        };
        for chunk in frames.chunks(SEAL_CHUNK_BYTES) {
            sealed.clear();
            sealer.seal(chunk, sealed).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
            (&self.stream).write_all(sealed)?;
        }
        Ok(())
    }

    /// Writes one or more whole frames from another thread. Errors are the connection's own
    /// business (its thread sees them too); they are only logged here.
    pub fn send_frames(&self, frames: &[u8]) -> bool {
        match self.write_frames(frames, None) {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(%error, "could not deliver a notice");
                false
            }
        }
    }
}

/// Open connections by connection number.
#[derive(Default)]
pub struct Peers {
    open: Mutex<HashMap<u64, Arc<Peer>>>,
}

impl Peers {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Peer>>> {
        // A map of handles stays consistent at every step; poisoning is no reason to stop.
        self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a new, not yet authenticated connection. Pre-authentication connections have a
    /// pool of their own (`max_unauthenticated`), separate from the authenticated ones: when it
    /// is full, the oldest of them (the lowest number) is shut down to make room, so a flood of
    /// connections that never authenticate can delay a legitimate client by one handshake at
    /// most, never lock it out. Returns the connection evicted, if any.
    pub fn insert_unauthenticated(
        &self,
        number: u64,
        peer: Arc<Peer>,
        max_unauthenticated: usize,
    ) -> Option<u64> {
        let mut open = self.lock();
        let mut evicted = None;
        let waiting: Vec<u64> =
            open.iter().filter(|(_, peer)| peer.client_id().is_none()).map(|(number, _)| *number).collect();
        if waiting.len() >= max_unauthenticated.max(1) {
            if let Some(&oldest) = waiting.iter().min() {
                if let Some(peer) = open.remove(&oldest) {
                    let _ = peer.stream.shutdown(std::net::Shutdown::Both);
                    evicted = Some(oldest);
                }
            }
        }
        open.insert(number, peer);
        evicted
    }

    /// Authenticated connections open now.
    pub fn authenticated_count(&self) -> usize {
        self.lock().values().filter(|peer| peer.client_id().is_some()).count()
    }

    pub fn remove(&self, number: u64) {
        self.lock().remove(&number);
    }

    pub fn get(&self, number: u64) -> Option<Arc<Peer>> {
        self.lock().get(&number).cloned()
    }

    /// The authenticated connections of `client_id` (not `except`), by number.
    pub fn of_client(&self, client_id: u64, except: Option<u64>) -> Vec<(u64, Arc<Peer>)> {
        self.lock()
            .iter()
            .filter(|(number, peer)| Some(**number) != except && peer.client_id() == Some(client_id))
            .map(|(number, peer)| (*number, Arc::clone(peer)))
            .collect()
    }

    /// Every connection of `client_id` that volunteered for `SlabActivityQuery`. A client may
    /// run several engines under one identity (`remem nbd --engines`), each on its own
    /// connections and knowing only its own slabs, so all of them are asked.
    pub fn activity_peers(&self, client_id: u64) -> Vec<Arc<Peer>> {
        self.lock()
            .values()
            .filter(|peer| {
                peer.client_id() == Some(client_id) && peer.answers_activity.load(Ordering::Relaxed)
            })
            .cloned()
            .collect()
    }

    /// Removes and returns every connection (for shutdown).
    pub fn drain(&self) -> Vec<Arc<Peer>> {
        self.lock().drain().map(|(_, peer)| peer).collect()
    }
}
