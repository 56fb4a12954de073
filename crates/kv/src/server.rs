//! The event loop: listeners, client connections and the client's sockets in one mio poll, on
//! one thread (run to completion: no hand-off between cores on the request path).
//!
//! Each connection parses as many pipelined requests as its buffer holds, and sends replies in
//! request order (a reply that finishes early waits for those before it). Bounds: a connection
//! buffers at most one request (line + item limit) of input, and stops reading while it has more
//! than [`MAX_PENDING_REPLIES`] replies outstanding or [`MAX_OUTPUT_BYTES`] unsent, so a client
//! that never reads cannot grow the server's memory.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Token};
use remem_memcache::{parse, Limits, Parse};

use crate::cache::{Cache, ConnRef};
use crate::commands::{self, After};

const TCP: Token = Token(0);
const UNIX: Token = Token(1);
const CLIENT: Token = Token(2);
const STANDBY: Token = Token(3);
const FIRST_CONNECTION: usize = 16;
pub const MAX_PENDING_REPLIES: usize = 4096;
pub const MAX_OUTPUT_BYTES: usize = 64 << 20;
/// Page ops waiting for an engine slot beyond which connections stop taking requests (each
/// waiting op holds a 4 KiB buffer).
pub const MAX_WAITING_PAGE_OPS: usize = 8192;
const READ_CHUNK: usize = 64 << 10;

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
    output: Vec<u8>,
    output_sent: usize,
    /// Quit, a fatal protocol error or end of input: close once the replies due are out.
    closing: bool,
    /// The peer is gone: close now.
    dead: bool,
    /// Reading stopped for backpressure; resume when replies drain.
    paused: bool,
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
    config: ServerConfig,
    /// Called once a second from the event loop (the CLI follows the cluster file with it).
    pub on_housekeeping: Option<Housekeeping>,
    /// Where a standby attaches (`crate::standby`), when this server keeps a backup region.
    standby: Option<crate::standby::StandbyPort>,
}

impl Server {
    /// Binds the listeners and registers the client's sockets.
    pub fn bind(cache: Cache, config: ServerConfig) -> io::Result<Server> {
        let poll = Poll::new()?;
        let mut tcp = match config.listen {
            Some(address) => Some(TcpListener::bind(address)?),
            None => None,
        };
        let mut unix = match &config.unix {
            Some(path) => {
                remove_stale_socket(path)?;
                let listener = UnixListener::bind(path)?;
                // Owner only: other local users reach the cache only if the owner widens it.
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                Some(listener)
            }
            None => None,
        };
        if let Some(listener) = tcp.as_mut() {
            poll.registry().register(listener, TCP, Interest::READABLE)?;
        }
        if let Some(listener) = unix.as_mut() {
            poll.registry().register(listener, UNIX, Interest::READABLE)?;
        }
        cache.client.register(poll.registry(), CLIENT)?;
        Ok(Server {
            poll,
            tcp,
            unix,
            connections: Vec::new(),
            next_generation: 1,
            cache,
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
            if self.cache.io.waiting() > 0
                || self.cache.io.unflushed
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
                || self.cache.io.waiting() > 0
            {
                self.cache.on_io(false);
            }
            self.cache.kick();
            if self.cache.io.waiting() < MAX_WAITING_PAGE_OPS / 2 {
                self.resume_paused();
            }
            if Instant::now() >= next_housekeeping {
                self.cache.housekeeping(crate::now_unix());
                if let Some(hook) = self.on_housekeeping.as_mut() {
                    hook(&mut self.cache);
                }
                next_housekeeping = Instant::now() + Duration::from_secs(1);
            }
            if let Some(port) = self.standby.as_mut() {
                port.step(&mut self.cache);
            }
            self.dispatch();
        }
        Ok(())
    }

    /// Connections that stopped for the page-op queue take requests again.
    fn resume_paused(&mut self) {
        for index in 0..self.connections.len() {
            let paused = self.connections[index].as_ref().is_some_and(|connection| {
                connection.paused
                    && (connection.next_seq - connection.next_to_send) as usize <= MAX_PENDING_REPLIES / 2
                    && connection.output.len() - connection.output_sent <= MAX_OUTPUT_BYTES / 2
            });
            if paused {
                if let Some(connection) = self.connections[index].as_mut() {
                    connection.paused = false;
                }
                self.process(index);
                self.read_connection(index);
            }
        }
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
            self.cache.stats.rejected_connections += 1;
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
        if let Err(error) =
            self.poll.registry().register(stream.source(), token, Interest::READABLE | Interest::WRITABLE)
        {
            tracing::warn!(%error, "registering a connection failed");
            return;
        }
        self.next_generation += 1;
        self.connections[index] = Some(Connection {
            stream,
            generation: self.next_generation,
            input: Vec::new(),
            swallow: 0,
            next_seq: 0,
            next_to_send: 0,
            replies: BTreeMap::new(),
            output: Vec::new(),
            output_sent: 0,
            closing: false,
            dead: false,
            paused: false,
            authenticated: self.config.auth.is_none(),
            started: std::collections::VecDeque::new(),
        });
        self.cache.stats.curr_connections += 1;
        self.cache.stats.total_connections += 1;
        // Data may have arrived with the connection (edge-triggered: no event would tell).
        self.read_connection(index);
    }

    fn read_connection(&mut self, index: usize) {
        let limit = self.config.limits.max_item_bytes + self.config.limits.max_line_bytes + 4096;
        loop {
            let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { return };
            if connection.dead || connection.closing {
                break;
            }
            if connection.replies.len() + (connection.next_seq - connection.next_to_send) as usize
                > MAX_PENDING_REPLIES
                || connection.output.len() - connection.output_sent > MAX_OUTPUT_BYTES
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
            let start = connection.input.len();
            connection.input.resize(start + READ_CHUNK, 0);
            match connection.stream.read(&mut connection.input[start..]) {
                Ok(0) => {
                    connection.input.truncate(start);
                    connection.dead = true;
                }
                Ok(read) => {
                    connection.input.truncate(start + read);
                    self.cache.stats.bytes_read += read as u64;
                    self.process(index);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    connection.input.truncate(start);
                    break;
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => connection.input.truncate(start),
                Err(_) => {
                    connection.input.truncate(start);
                    connection.dead = true;
                }
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
            if (connection.next_seq - connection.next_to_send) as usize > MAX_PENDING_REPLIES
                || self.cache.io.waiting() > MAX_WAITING_PAGE_OPS
            {
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
                        self.cache.reply(conn, seq, reply.to_vec());
                        connection.closing |= close;
                        continue;
                    }
                    let (first, kind) = (connection.next_seq, crate::latency::Kind::of(&request));
                    let parsed = std::time::Instant::now();
                    if commands::execute(&mut self.cache, conn, &mut connection.next_seq, request)
                        == After::Close
                    {
                        connection.closing = true;
                    }
                    if connection.next_seq > first {
                        connection.started.push_back((first, kind, parsed));
                    }
                }
                Parse::Invalid { error, consumed, swallow, close, noreply } => {
                    offset += consumed;
                    connection.swallow = swallow;
                    let seq = connection.next_seq;
                    connection.next_seq += 1;
                    let mut bytes = Vec::new();
                    if !noreply {
                        error.write_to(&mut bytes);
                    }
                    self.cache.reply(conn, seq, bytes);
                    if close {
                        connection.closing = true;
                    }
                }
            }
        }
        let consumed_any = offset > 0;
        let mut input = input;
        input.drain(..offset);
        connection.input = input;
        consumed_any
    }

    /// Puts finished replies in their connections' order and writes what is due.
    fn dispatch(&mut self) {
        if self.cache.outbox.is_empty() {
            return;
        }
        // No reply leaves before the standby's copy holds the records it acknowledges.
        if let Some(backup) = self.cache.backup.as_mut() {
            backup.barrier();
        }
        let outs = std::mem::take(&mut self.cache.outbox);
        let mut touched = Vec::new();
        for out in outs {
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
                self.cache.stats.latency.record(kind, started.elapsed());
            }
            // A place an earlier reply ended its command through sends nothing.
            if out.seq >= connection.next_to_send {
                connection.replies.insert(out.seq, (out.bytes, out.ends_through));
            }
            if !touched.contains(&out.conn.index) {
                touched.push(out.conn.index);
            }
        }
        for index in touched {
            let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { continue };
            while let Some((bytes, ends_through)) = connection.replies.remove(&connection.next_to_send) {
                connection.output.extend_from_slice(&bytes);
                connection.next_to_send += 1;
                if let Some(through) = ends_through {
                    // The rest of the command (some of it may be done already) sends nothing.
                    connection.replies.retain(|&seq, _| seq > through);
                    connection.next_to_send = connection.next_to_send.max(through + 1);
                }
            }
            self.write_connection(index);
        }
    }

    fn write_connection(&mut self, index: usize) {
        let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { return };
        while connection.output_sent < connection.output.len() && !connection.dead {
            match connection.stream.write(&connection.output[connection.output_sent..]) {
                Ok(0) => connection.dead = true,
                Ok(written) => {
                    connection.output_sent += written;
                    self.cache.stats.bytes_written += written as u64;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => connection.dead = true,
            }
        }
        if connection.output_sent == connection.output.len() {
            connection.output.clear();
            connection.output_sent = 0;
        } else if connection.output_sent > (1 << 20) {
            connection.output.drain(..connection.output_sent);
            connection.output_sent = 0;
        }
        let resume = connection.paused
            && (connection.next_seq - connection.next_to_send) as usize <= MAX_PENDING_REPLIES / 2
            && connection.output.len() - connection.output_sent <= MAX_OUTPUT_BYTES / 2;
        if resume {
            connection.paused = false;
            self.process(index);
            self.read_connection(index);
            return;
        }
        self.close_if_done(index);
    }

    fn close_if_done(&mut self, index: usize) {
        let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { return };
        let replies_out = connection.next_to_send == connection.next_seq
            && connection.output_sent == connection.output.len();
        if connection.dead || (connection.closing && replies_out) {
            let mut connection = self.connections[index].take().expect("present");
            let _ = self.poll.registry().deregister(connection.stream.source());
            self.cache.stats.curr_connections -= 1;
        }
    }
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
