//! The event loop: listeners, client connections and the client's sockets in one mio poll, on
//! one thread (run to completion: no hand-off between cores on the request path).
//!
//! Each connection parses as many pipelined requests as its buffer holds, and sends replies in
//! request order (a reply that finishes early waits for those before it). Bounds: a connection
//! buffers at most one request (line + item limit) of input, and stops reading while it has more
//! than [`MAX_PENDING_REPLIES`] replies outstanding or its output budget (`crate::budget`) does
//! not admit another value: the bytes held for replies (values being fetched for gets, replies
//! waiting for their turn, output not yet written) are counted per connection and in all, so
//! clients that never read cannot grow the server's memory, and a multi-get of many large
//! values streams a bounded number of them at a time ([`text::continue_get`]).

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Token};
use remem_memcache::{parse, Limits, Parse};

use crate::cache::Cache;
use crate::completion::ConnRef;
use crate::reply::Outbox;
use crate::text::{self, After, MultiGet};

const TCP: Token = Token(0);
const UNIX: Token = Token(1);
const CLIENT: Token = Token(2);
const STANDBY: Token = Token(3);
const FIRST_CONNECTION: usize = 16;
pub const MAX_PENDING_REPLIES: usize = 4096;
/// Page ops waiting for an engine slot beyond which connections stop taking requests (each
/// waiting op holds a 4 KiB buffer).
pub const MAX_WAITING_PAGE_OPS: usize = 8192;
const READ_CHUNK: usize = 64 << 10;
/// Replies smaller than this are copied behind the last output buffer (one write for many small
/// replies); larger ones are queued as they are, without a copy.
const COALESCE_BYTES: usize = 64 << 10;
/// Most buffers one vectored write takes.
const WRITE_SLICES: usize = 64;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: Option<SocketAddr>,
    pub unix: Option<PathBuf>,
    pub max_connections: usize,
    pub limits: Limits,
    /// memcached's ASCII authentication (`-Y`): when set, a connection must first send
    /// `set <any> <any> <any> <len>` with `<user> <password>` as data, else every command gets
    /// `CLIENT_ERROR unauthenticated`.
    pub auth: Option<crate::auth::Credentials>,
    /// Bytes held for replies by all connections (`crate::budget`; each may hold a quarter, at
    /// most 64 MiB).
    pub output_budget_bytes: usize,
}

/// A task the embedder runs once a second on the event loop's thread.
pub type Housekeeping = Box<dyn FnMut(&mut Cache)>;

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(stream) => stream,
            Stream::Unix(stream) => stream,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.read(buf),
            Stream::Unix(stream) => stream.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.write(buf),
            Stream::Unix(stream) => stream.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.write_vectored(bufs),
            Stream::Unix(stream) => stream.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Connection {
    stream: Stream,
    generation: u64,
    input: Vec<u8>,
    /// Bytes still to discard (the data block of a rejected set).
    swallow: usize,
    next_seq: u64,
    next_to_send: u64,
    /// Finished replies waiting for their turn, and how far each ends its command.
    replies: BTreeMap<u64, (Vec<u8>, Option<u64>)>,
    /// Replies due, in order, not yet written; the first is written up to `output_sent`.
    output: VecDeque<Vec<u8>>,
    output_sent: usize,
    /// Bytes of `output` not yet written.
    output_bytes: usize,
    /// A multi-key get whose keys are not all started: no other request runs before it is.
    multi_get: Option<MultiGet>,
    /// Quit, a fatal protocol error or end of input: close once the replies due are out.
    closing: bool,
    /// The peer is gone: close now.
    dead: bool,
    /// Reading stopped for backpressure; resume when replies drain or the budget admits more.
    paused: bool,
    /// Registered for writability: only while a write found the socket full (memcached's way:
    /// an edge for every ack of every reply would wake the loop once more per request).
    wants_writable: bool,
    /// Passed memcached's ASCII authentication (always, without `--auth-file`).
    authenticated: bool,
    /// Requests whose first reply is not out yet: (its seq, kind, parse time), for latency.
    started: std::collections::VecDeque<(u64, crate::latency::Kind, std::time::Instant)>,
}

pub struct Server {
    poll: Poll,
    tcp: Option<TcpListener>,
    unix: Option<UnixListener>,
    connections: Vec<Option<Connection>>,
    next_generation: u64,
    pub cache: Cache,
    /// Replies made and not yet put in their connections' order.
    outbox: Outbox,
    /// Where sockets are read into, zeroed once: a connection's input takes only the bytes that
    /// came (growing its own buffer zeroed 64 KiB per read, twice a request with the read that
    /// finds the socket empty, was the server's largest cost).
    read_buffer: Box<[u8]>,
    config: ServerConfig,
    /// Called once a second from the event loop (the CLI follows the cluster file with it).
    pub on_housekeeping: Option<Housekeeping>,
    /// Where a standby attaches (`crate::standby`), when this server keeps a backup region.
    standby: Option<crate::standby::StandbyPort>,
}

impl Connection {
    fn conn(&self, index: usize) -> ConnRef {
        ConnRef { index, generation: self.generation }
    }

    /// Queues a reply that is due (its place came).
    fn push_output(&mut self, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        self.output_bytes += bytes.len();
        match self.output.back_mut() {
            Some(last) if last.len() + bytes.len() <= COALESCE_BYTES => last.extend_from_slice(&bytes),
            _ => self.output.push_back(bytes),
        }
    }

    /// `written` bytes of the output left: buffers written whole are freed.
    fn consume_output(&mut self, mut written: usize) {
        assert!(written <= self.output_bytes);
        self.output_bytes -= written;
        while written > 0 {
            let first = self.output.front().expect("bytes written come from a buffer");
            let left = first.len() - self.output_sent;
            if written < left {
                self.output_sent += written;
                return;
            }
            written -= left;
            self.output.pop_front();
            self.output_sent = 0;
        }
    }

    /// Replies started and not sent yet. The places a multi-get has not started yet do not
    /// count: they hold nothing, and its keys start only as these replies go out.
    fn outstanding_replies(&self) -> usize {
        let unstarted = self.multi_get.as_ref().map_or(0, MultiGet::unstarted);
        (self.next_seq - self.next_to_send).saturating_sub(unstarted) as usize
    }

    /// Bytes this connection holds in its own buffers (replies waiting and output).
    fn buffered_bytes(&self) -> usize {
        self.replies.values().map(|(bytes, _)| bytes.len()).sum::<usize>() + self.output_bytes
    }
}

impl Server {
    /// Binds the listeners and registers the client's sockets.
    pub fn bind(mut cache: Cache, config: ServerConfig) -> io::Result<Server> {
        *cache.budget_mut() = crate::budget::OutputBudget::new(config.output_budget_bytes);
        let poll = Poll::new()?;
        let mut tcp = match config.listen {
            Some(address) => Some(TcpListener::bind(address)?),
            None => None,
        };
        let mut unix = match &config.unix {
            Some(path) => {
                remove_stale_socket(path)?;
                Some(bind_unix_owner_only(path)?)
            }
            None => None,
        };
        if let Some(listener) = tcp.as_mut() {
            poll.registry().register(listener, TCP, Interest::READABLE)?;
        }
        if let Some(listener) = unix.as_mut() {
            poll.registry().register(listener, UNIX, Interest::READABLE)?;
        }
        cache.client_mut().register(poll.registry(), CLIENT)?;
        Ok(Server {
            poll,
            tcp,
            unix,
            connections: Vec::new(),
            next_generation: 1,
            cache,
            outbox: Outbox::default(),
            read_buffer: vec![0; READ_CHUNK].into_boxed_slice(),
            config,
            on_housekeeping: None,
            standby: None,
        })
    }

    /// Takes standbys at `port` from now on.
    pub fn serve_standbys(&mut self, port: crate::standby::StandbyPort) -> io::Result<()> {
        self.poll.registry().register(&mut mio::unix::SourceFd(&port.fd()), STANDBY, Interest::READABLE)?;
        self.standby = Some(port);
        Ok(())
    }

    pub fn standby_port(&self) -> Option<&crate::standby::StandbyPort> {
        self.standby.as_ref()
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|listener| listener.local_addr().ok())
    }

    /// Serves until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut next_housekeeping = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let mut timeout =
                Duration::from_millis(200).min(next_housekeeping.saturating_duration_since(now));
            if let Some(deadline) = self.cache.next_deadline() {
                timeout = timeout.min(deadline.saturating_duration_since(now));
            }
            if self.cache.io().waiting() > 0
                || self.cache.io().unflushed
                || self.standby.as_ref().is_some_and(|port| port.busy())
            {
                timeout = Duration::ZERO;
            }
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            }
            let mut client_readable = false;
            for event in events.iter() {
                match event.token() {
                    TCP => self.accept_tcp(),
                    UNIX => self.accept_unix(),
                    CLIENT => client_readable = true,
                    STANDBY => {
                        if let Some(port) = self.standby.as_mut() {
                            port.accept(&mut self.cache);
                        }
                    }
                    Token(token) => {
                        let index = token - FIRST_CONNECTION;
                        if event.is_error() || (event.is_read_closed() && event.is_write_closed()) {
                            // The peer is gone: a paused connection, which reads nothing, would
                            // otherwise keep its output (and its budget) until it resumed.
                            if let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut)
                            {
                                connection.dead = true;
                            }
                            self.close_if_done(index);
                            continue;
                        }
                        if event.is_readable() || event.is_read_closed() {
                            self.read_connection(index);
                        }
                        if event.is_writable() {
                            self.write_connection(index);
                        }
                    }
                }
            }
            if client_readable {
                self.cache.on_io(true);
            }
            if self.cache.next_deadline().is_some_and(|deadline| deadline <= Instant::now())
                || self.cache.io().waiting() > 0
            {
                self.cache.on_io(false);
            }
            self.cache.kick();
            // Read-modify-writes whose values arrived are applied before any request is read.
            crate::dispatch::settle(&mut self.cache, &mut self.outbox);
            if self.cache.io().waiting() < MAX_WAITING_PAGE_OPS / 2 {
                self.resume_paused();
            }
            if Instant::now() >= next_housekeeping {
                self.cache.housekeeping(crate::clock::now_unix());
                if let Some(hook) = self.on_housekeeping.as_mut() {
                    hook(&mut self.cache);
                }
                crate::dispatch::settle(&mut self.cache, &mut self.outbox);
                next_housekeeping = Instant::now() + Duration::from_secs(1);
            }
            if let Some(port) = self.standby.as_mut() {
                port.step(&mut self.cache);
            }
            self.dispatch();
        }
        Ok(())
    }

    /// Connections that stopped for the page-op queue or the budget take requests again.
    fn resume_paused(&mut self) {
        for index in 0..self.connections.len() {
            let paused = self.connections[index]
                .as_ref()
                .is_some_and(|connection| connection.paused && self.may_resume(index, connection));
            if paused {
                if let Some(connection) = self.connections[index].as_mut() {
                    connection.paused = false;
                }
                self.process(index);
                self.read_connection(index);
            }
        }
    }

    /// Whether a paused connection may take requests again: its replies drained to half the
    /// bound and its budget admits another value.
    fn may_resume(&self, index: usize, connection: &Connection) -> bool {
        connection.outstanding_replies() <= MAX_PENDING_REPLIES / 2
            && self.cache.budget().admits(connection.conn(index))
    }

    fn accept_tcp(&mut self) {
        loop {
            let Some(listener) = self.tcp.as_ref() else { return };
            match listener.accept() {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    self.add_connection(Stream::Tcp(stream));
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    return;
                }
            }
        }
    }

    fn accept_unix(&mut self) {
        loop {
            let Some(listener) = self.unix.as_ref() else { return };
            match listener.accept() {
                Ok((stream, _)) => self.add_connection(Stream::Unix(stream)),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    return;
                }
            }
        }
    }

    fn add_connection(&mut self, mut stream: Stream) {
        let open = self.connections.iter().filter(|connection| connection.is_some()).count();
        if open >= self.config.max_connections {
            // memcached's answer when it is out of connections.
            let _ = stream.write(b"ERROR Too many open connections\r\n");
            self.cache.stats_mut().rejected_connections += 1;
            return;
        }
        let index = match self.connections.iter().position(Option::is_none) {
            Some(index) => index,
            None => {
                self.connections.push(None);
                self.connections.len() - 1
            }
        };
        let token = Token(FIRST_CONNECTION + index);
        if let Err(error) = self.poll.registry().register(stream.source(), token, Interest::READABLE) {
            tracing::warn!(%error, "registering a connection failed");
            return;
        }
        self.next_generation += 1;
        self.cache.budget_mut().open(ConnRef { index, generation: self.next_generation });
        self.connections[index] = Some(Connection {
            stream,
            generation: self.next_generation,
            input: Vec::new(),
            swallow: 0,
            next_seq: 0,
            next_to_send: 0,
            replies: BTreeMap::new(),
            output: VecDeque::new(),
            output_sent: 0,
            output_bytes: 0,
            multi_get: None,
            closing: false,
            dead: false,
            paused: false,
            wants_writable: false,
            authenticated: self.config.auth.is_none(),
            started: std::collections::VecDeque::new(),
        });
        self.cache.stats_mut().curr_connections += 1;
        self.cache.stats_mut().total_connections += 1;
        // Data may have arrived with the connection (edge-triggered: no event would tell).
        self.read_connection(index);
    }

    fn read_connection(&mut self, index: usize) {
        let limit = self.config.limits.max_request_bytes() + 4096;
        loop {
            let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { return };
            if connection.dead || connection.closing {
                break;
            }
            if connection.replies.len() + connection.outstanding_replies() > MAX_PENDING_REPLIES
                || connection.multi_get.is_some()
                || !self.cache.budget().admits(connection.conn(index))
            {
                connection.paused = true;
                break;
            }
            if connection.input.len() >= limit {
                // A whole request fits below the limit: parse what is there first.
                if !self.process(index) {
                    break;
                }
                continue;
            }
            match connection.stream.read(&mut self.read_buffer) {
                Ok(0) => connection.dead = true,
                Ok(read) => {
                    connection.input.extend_from_slice(&self.read_buffer[..read]);
                    self.cache.stats_mut().bytes_read += read as u64;
                    self.process(index);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => connection.dead = true,
            }
        }
        self.dispatch();
        self.close_if_done(index);
    }

    /// Runs every complete request in the connection's input. False when nothing was consumed.
    fn process(&mut self, index: usize) -> bool {
        let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { return false };
        let conn = ConnRef { index, generation: connection.generation };
        let input = std::mem::take(&mut connection.input);
        let mut offset = 0;
        loop {
            if let Some(get) = connection.multi_get.as_mut() {
                // A lost value's SERVER_ERROR ended the answer: the other keys send nothing.
                if connection.next_to_send > get.end()
                    || text::continue_get(&mut self.cache, &mut self.outbox, conn, get)
                {
                    connection.multi_get = None;
                } else {
                    connection.paused = true;
                    break;
                }
            }
            if connection.swallow > 0 {
                let skipped = connection.swallow.min(input.len() - offset);
                offset += skipped;
                connection.swallow -= skipped;
                if connection.swallow > 0 {
                    break;
                }
            }
            if offset == input.len() || connection.closing {
                break;
            }
            if connection.outstanding_replies() > MAX_PENDING_REPLIES
                || self.cache.io().waiting() > MAX_WAITING_PAGE_OPS
            {
                connection.paused = true;
                break;
            }
            if !self.cache.budget().admits(conn) {
                self.cache.budget_mut().waits += 1;
                connection.paused = true;
                break;
            }
            match parse(&input[offset..], &self.config.limits) {
                Parse::Incomplete => break,
                Parse::Request { request, consumed } => {
                    offset += consumed;
                    if !connection.authenticated {
                        let seq = connection.next_seq;
                        connection.next_seq += 1;
                        let credentials =
                            self.config.auth.as_ref().expect("unauthenticated only with an auth file");
                        let (reply, close) = crate::auth::authenticate(credentials, &request);
                        connection.authenticated = reply == crate::auth::STORED;
                        self.outbox.reply(conn, seq, reply.to_vec());
                        connection.closing |= close;
                        continue;
                    }
                    let (first, kind) = (connection.next_seq, crate::latency::Kind::of(&request));
                    let parsed = std::time::Instant::now();
                    match crate::dispatch::execute(
                        &mut self.cache,
                        &mut self.outbox,
                        conn,
                        &mut connection.next_seq,
                        request,
                    ) {
                        After::Continue => {}
                        After::Close => connection.closing = true,
                        After::Get(get) => connection.multi_get = Some(get),
                    }
                    if connection.next_seq > first {
                        connection.started.push_back((first, kind, parsed));
                    }
                }
                Parse::Invalid { error, consumed, swallow, close, noreply, unlink } => {
                    offset += consumed;
                    connection.swallow = swallow;
                    // A set refused as too large leaves no stale value (memcached unlinks it),
                    // but only a client that may write removes anything.
                    if let (Some(key), true) = (unlink, connection.authenticated) {
                        crate::commands::unlink(&mut self.cache, &key, crate::clock::now_unix());
                    }
                    let seq = connection.next_seq;
                    connection.next_seq += 1;
                    let mut bytes = Vec::new();
                    if !noreply {
                        error.write_to(&mut bytes);
                    }
                    self.outbox.reply(conn, seq, bytes);
                    if close {
                        connection.closing = true;
                    }
                }
            }
        }
        let consumed_any = offset > 0;
        let mut input = input;
        input.drain(..offset);
        if input.is_empty() && input.capacity() > 2 * READ_CHUNK {
            // A large request came and went: an idle connection keeps no megabyte buffer.
            input = Vec::new();
        }
        connection.input = input;
        consumed_any
    }

    /// Puts finished replies in their connections' order and writes what is due.
    fn dispatch(&mut self) {
        // Values that finished during the last engine call without a settle after it (a key
        // of a resumed multi-get served from the chunk cache) are answered now.
        crate::dispatch::settle(&mut self.cache, &mut self.outbox);
        if self.outbox.is_empty() {
            return;
        }
        // No reply leaves before the standby's copy holds the records it acknowledges.
        if let Some(backup) = self.cache.backup_mut() {
            backup.barrier();
        }
        let outs = self.outbox.take();
        let mut touched = Vec::new();
        for out in outs {
            // The reply replaces what was reserved for it (a closed connection's is dropped).
            self.cache.budget_mut().release(out.conn, out.reserved);
            let Some(connection) = self.connections.get_mut(out.conn.index).and_then(Option::as_mut) else {
                continue;
            };
            if connection.generation != out.conn.generation {
                continue;
            }
            // Pending requests are few (replies go out in order); the one this reply starts is
            // usually at the front.
            if let Some(position) = connection.started.iter().position(|&(seq, _, _)| seq == out.seq) {
                let (_, kind, started) = connection.started.remove(position).expect("found above");
                self.cache.stats_mut().latency.record(kind, started.elapsed());
            }
            // A place an earlier reply ended its command through sends nothing.
            if out.seq >= connection.next_to_send {
                self.cache.budget_mut().hold(out.conn, out.bytes.len());
                let previous = connection.replies.insert(out.seq, (out.bytes, out.ends_through));
                assert!(previous.is_none(), "two replies for place {}", out.seq);
            }
            if !touched.contains(&out.conn.index) {
                touched.push(out.conn.index);
            }
        }
        for index in touched {
            let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { continue };
            while let Some((bytes, ends_through)) = connection.replies.remove(&connection.next_to_send) {
                connection.push_output(bytes);
                connection.next_to_send += 1;
                if let Some(through) = ends_through {
                    // The rest of the command (some of it may be done already) sends nothing.
                    let rest = connection.replies.split_off(&(through + 1));
                    let dropped = std::mem::replace(&mut connection.replies, rest);
                    let dropped_bytes = dropped.values().map(|(bytes, _)| bytes.len()).sum();
                    self.cache.budget_mut().release(connection.conn(index), dropped_bytes);
                    connection.next_to_send = connection.next_to_send.max(through + 1);
                }
            }
            self.write_connection(index);
        }
    }

    fn write_connection(&mut self, index: usize) {
        let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { return };
        let conn = connection.conn(index);
        while connection.output_bytes > 0 && !connection.dead {
            let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
            let mut count = 0;
            for (position, buffer) in connection.output.iter().take(WRITE_SLICES).enumerate() {
                let start = if position == 0 { connection.output_sent } else { 0 };
                slices[count] = IoSlice::new(&buffer[start..]);
                count += 1;
            }
            match connection.stream.write_vectored(&slices[..count]) {
                Ok(0) => connection.dead = true,
                Ok(written) => {
                    connection.consume_output(written);
                    self.cache.budget_mut().release(conn, written);
                    self.cache.stats_mut().bytes_written += written as u64;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => connection.dead = true,
            }
        }
        let blocked = connection.output_bytes > 0 && !connection.dead;
        if blocked != connection.wants_writable {
            let interest = if blocked { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
            let token = Token(FIRST_CONNECTION + index);
            match self.poll.registry().reregister(connection.stream.source(), token, interest) {
                Ok(()) => connection.wants_writable = blocked,
                Err(_) => connection.dead = true,
            }
        }
        let connection = self.connections[index].as_ref().expect("present");
        if connection.paused && self.may_resume(index, connection) {
            if let Some(connection) = self.connections[index].as_mut() {
                connection.paused = false;
            }
            self.process(index);
            self.read_connection(index);
            return;
        }
        self.close_if_done(index);
    }

    fn close_if_done(&mut self, index: usize) {
        let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { return };
        let replies_out = connection.next_to_send == connection.next_seq && connection.output_bytes == 0;
        if connection.dead || (connection.closing && replies_out) {
            let mut connection = self.connections[index].take().expect("present");
            let _ = self.poll.registry().deregister(connection.stream.source());
            self.cache.stats_mut().curr_connections -= 1;
            // Its buffers go now; the reservations of its fetches in flight go when they finish.
            let conn = connection.conn(index);
            let buffered = connection.buffered_bytes();
            assert!(buffered <= self.cache.budget().held_by(conn), "a connection holds what it buffers");
            self.cache.budget_mut().release(conn, buffered);
            self.cache.budget_mut().close(conn);
        }
    }
}

/// Binds the Unix socket so that it is never open to other users, not even for an instant: it
/// is created under a umask that leaves only the owner (as `remem nbd` does), instead of being
/// made 0600 after the bind, when another user may have connected already.
fn bind_unix_owner_only(path: &std::path::Path) -> io::Result<UnixListener> {
    // SAFETY: umask has no preconditions. It is process-wide: the server binds at start-up,
    // before its metrics thread exists, and no other thread creates files meanwhile (the
    // client's probe threads, if a node is down, only open sockets).
    let previous = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the mask the process had.
    unsafe { libc::umask(previous) };
    let listener = bound?;
    // 0600 exactly, whatever stricter mask the process had.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

fn remove_stale_socket(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}
