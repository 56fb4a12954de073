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
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, UnixListener};
use mio::{Events, Interest, Poll, Token, Waker};
use remem_memcache::{parse, Limits, Parse};

use crate::cache::Cache;
use crate::completion::ConnRef;
use crate::reply::Outbox;
use crate::sockets::{bind_unix_owner_only, remove_stale_socket, Stream};
use crate::text::{self, After, MultiGet};

mod output;

const TCP: Token = Token(0);
const UNIX: Token = Token(1);
const CLIENT: Token = Token(2);
const STANDBY: Token = Token(3);
/// Reply writers wake the loop with reports (`crate::writers`).
const WRITERS: Token = Token(4);
const FIRST_CONNECTION: usize = 16;
pub const MAX_PENDING_REPLIES: usize = 4096;
/// Page ops waiting for an engine slot beyond which connections stop taking requests (each
/// waiting op holds a 4 KiB buffer).
pub const MAX_WAITING_PAGE_OPS: usize = 8192;
const READ_CHUNK: usize = 64 << 10;
/// Replies smaller than this are copied behind the last output buffer (one write for many small
/// replies); larger ones are queued as they are, without a copy.
const COALESCE_BYTES: usize = 64 << 10;

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
    /// While page ops are in flight and nothing else is due, poll without blocking this long
    /// before sleeping: on these VMs a sleeping thread costs 20-25 us to wake on the other vCPU
    /// (docs/DESIGN facts), and a node's reply over TCP is often on its way already. Zero never
    /// spins; long spins take the core the nodes need.
    pub spin: Duration,
    /// Threads in all (memcached's `-t`): 1 does everything on the event loop's thread; more
    /// adds `threads - 1` reply writers (`crate::writers`).
    pub threads: usize,
    /// TLS on the TCP listener (`--enable-ssl`): every TCP connection speaks it; the Unix socket
    /// stays plain, as memcached's. TLS connections are written by the loop's thread only.
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
}

/// A task the embedder runs once a second on the event loop's thread.
pub type Housekeeping = Box<dyn FnMut(&mut Cache)>;

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
    /// Of `output_bytes`, those handed to the connection's reply writer and not reported
    /// written yet (`crate::writers`); the rest are in `output`.
    in_writer: usize,
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
    /// Why the server must stop (the state could not be made durable): `run` returns it.
    failed: Option<String>,
    /// Where a standby attaches (`crate::standby`), when this server keeps a backup region.
    standby: Option<crate::standby::StandbyPort>,
    /// With `--threads` above 1: the threads that write replies.
    writers: Option<crate::writers::Writers>,
    /// Events of the loop's last poll: with one, a reply is written on the loop's thread when
    /// its writer sleeps (handing it over would cost a wake-up on the request's path).
    turn_events: usize,
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
    fn consume_output(&mut self, written: usize) {
        assert!(written <= self.output_bytes);
        self.output_bytes -= written;
        crate::writers::consume(&mut self.output, &mut self.output_sent, written);
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
        cache.stats_mut().threads = config.threads.max(1) as u64;
        cache.stats_mut().ssl_enabled = config.tls.is_some();
        let writers = match config.threads {
            0 | 1 => None,
            threads => {
                let waker = Arc::new(Waker::new(poll.registry(), WRITERS)?);
                Some(crate::writers::Writers::start(threads - 1, waker, config.spin)?)
            }
        };
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
            failed: None,
            standby: None,
            writers,
            turn_events: 0,
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
        // When page ops last went in flight with none before: the loop polls for their replies
        // for `spin` from then on, however many arrive meanwhile, and then sleeps (a spell
        // renewed by each reply would keep a core from the nodes while replies trickle in).
        let mut spinning_since: Option<Instant> = None;
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
            if self.cache.io().busy() == 0 {
                spinning_since = None;
            } else if !timeout.is_zero() && !self.config.spin.is_zero() {
                let since = *spinning_since.get_or_insert(now);
                if now.duration_since(since) < self.config.spin {
                    timeout = Duration::ZERO;
                }
            }
            if !timeout.is_zero() && self.writers.is_some() && self.ask_for_reports() {
                timeout = Duration::ZERO;
            }
            let polled = self.poll.poll(&mut events, Some(timeout));
            if let Some(writers) = &self.writers {
                writers.want_reports(false);
            }
            match polled {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            }
            self.turn_events = events.iter().count();
            self.take_reports();
            let mut client_readable = false;
            for event in events.iter() {
                match event.token() {
                    TCP => self.accept_tcp(),
                    UNIX => self.accept_unix(),
                    CLIENT => client_readable = true,
                    WRITERS => {}
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
            if let Some(error) = self.failed.take() {
                return Err(io::Error::other(error));
            }
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
                    let stream = match &self.config.tls {
                        None => Stream::Tcp(stream),
                        Some(config) => match crate::tls::TlsStream::new(stream, config) {
                            Ok(stream) => Stream::Tls(Box::new(stream)),
                            Err(error) => {
                                tracing::warn!(%error, "starting TLS on a connection failed");
                                continue;
                            }
                        },
                    };
                    self.add_connection(stream);
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
            if !stream.is_tls() {
                let _ = stream.write(b"ERROR Too many open connections\r\n");
            }
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
        if let (Some(writers), false) = (&self.writers, stream.is_tls()) {
            let socket = match stream.as_fd().try_clone_to_owned() {
                Ok(socket) => socket,
                Err(error) => {
                    tracing::warn!(%error, "duplicating a connection's socket for its writer failed");
                    let _ = self.poll.registry().deregister(stream.source());
                    return;
                }
            };
            let generation = self.next_generation;
            writers.send(index, crate::writers::Job::Attach { index, generation, socket });
        }
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
            in_writer: 0,
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
                    // A read that did not fill the buffer emptied the socket: with mio's
                    // edge-triggered epoll the next bytes bring a new event, so the read that
                    // would find nothing (a syscall per request) is skipped, as tokio does.
                    if read < self.read_buffer.len() {
                        break;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => connection.dead = true,
            }
        }
        // A TLS handshake's answer the socket had no room for waits for it to be writable.
        if self.connections.get(index).and_then(Option::as_ref).is_some_and(|c| c.stream.wants_write()) {
            self.write_connection(index);
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
}
