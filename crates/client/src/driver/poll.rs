//! The poll driver: the engine embedded in a front end's own event loop, so a server keeps
//! accepting requests while others wait on a slow node, with no batch barrier.
//!
//! The client's sockets sit behind one epoll descriptor; [`PollClient::register`] puts that
//! descriptor into the embedder's mio `Registry` (epoll descriptors nest). When the embedder's
//! poll reports it readable, it calls [`PollClient::on_readable`]; it waits no longer than
//! [`PollClient::next_deadline`] and calls [`PollClient::on_timer`] when that passes. Ops are
//! submitted at any time with a tag of the caller's choosing; read buffers stay the caller's
//! ([`OpBuffers`], named by tag) and must be handed in on every call that may complete a read.

use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use super::Client;
use crate::engine::{OpBuffers, OpDone, Submit};

/// A [`Client`] driven by someone else's event loop.
pub struct PollClient {
    client: Client,
}

impl PollClient {
    /// Takes over a connected client (connect it with [`Client::connect`] first).
    pub fn new(client: Client) -> PollClient {
        PollClient { client }
    }

    /// Registers the client's sockets (one epoll descriptor) with `registry` under `token`.
    pub fn register(&self, registry: &Registry, token: Token) -> io::Result<()> {
        let fd = self.client.transport.poll_fd();
        registry.register(&mut SourceFd(&fd), token, Interest::READABLE)
    }

    /// Starts an op tagged `tag`. False when it cannot start now (every op slot busy, or an op
    /// on the same page in flight): submit it again after a completion. Its frames are sent
    /// before this returns.
    pub fn submit(&mut self, tag: usize, op: Submit<'_>, buffers: &mut dyn OpBuffers) -> bool {
        let client = &mut self.client;
        if !client.engine.submit(Instant::now(), tag, op, buffers) {
            return false;
        }
        client.transport.flush_all(&mut client.engine, buffers);
        true
    }

    /// Starts an op like [`PollClient::submit`] but leaves its frames in the per-node outboxes:
    /// they leave at the next [`PollClient::flush`], [`PollClient::on_readable`] or
    /// [`PollClient::on_timer`]. A front end that starts the pages of several requests at once
    /// then sends them with one write per node instead of one per page and node.
    pub fn submit_unflushed(&mut self, tag: usize, op: Submit<'_>, buffers: &mut dyn OpBuffers) -> bool {
        self.client.engine.submit(Instant::now(), tag, op, buffers)
    }

    /// Sends every queued frame.
    pub fn flush(&mut self, buffers: &mut dyn OpBuffers) {
        let client = &mut self.client;
        client.transport.flush_all(&mut client.engine, buffers);
    }

    /// The client's epoll descriptor was readable: reads every reply that is there, without
    /// blocking, and advances the ops.
    pub fn on_readable(&mut self, buffers: &mut dyn OpBuffers) {
        self.client.run_loop_once(Some(Duration::ZERO), buffers);
    }

    /// The deadline passed (or any time): heartbeats, op deadlines, probes, rebuilds.
    pub fn on_timer(&mut self, buffers: &mut dyn OpBuffers) {
        self.client.run_loop_once(Some(Duration::ZERO), buffers);
    }

    /// When [`PollClient::on_timer`] must run at the latest.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.client.engine.next_deadline()
    }

    /// Ops completed since the last call.
    pub fn completions(&mut self) -> std::vec::Drain<'_, OpDone> {
        self.client.engine.take_completions()
    }

    /// Ops in flight.
    pub fn in_flight(&self) -> usize {
        self.client.engine.active()
    }

    /// The client, for calls between ops (regions, membership, node info).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }
}

impl AsRawFd for PollClient {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.client.transport.poll_fd()
    }
}
