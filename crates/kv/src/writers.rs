//! Reply writers: with `--threads N` (N > 1), N - 1 threads that write replies to client sockets
//! for the event loop, which keeps everything else (requests, the cache, the standby, stats).
//!
//! Why this split: at many connections the send is most of a server's CPU. Over loopback TCP the
//! kernel delivers the bytes to the receiver and wakes it inside the sender's syscall; `perf`
//! puts 63% of `remem kv`'s single thread in `writev` at 32 connections, and 64% of memcached's
//! threads in `sendmsg`. Moving only the sends off the loop lets the server use a second core
//! while the cache stays one structure on one thread: transitions, the standby's barrier and
//! `flush_all` are unchanged, and a writer holds nothing but bytes and a socket.
//!
//! Protocol between the loop and a writer (each connection has one writer, `index % writers`, so
//! its bytes leave in order):
//! - the loop sends [`Job`]s over a channel and wakes the writer only when it sleeps;
//! - the writer sends back a [`Written`] report per connection and pass, and wakes the loop
//!   only when the loop asked for reports (`want_reports`: a connection waits for its output to
//!   drain, to resume or to close); otherwise the loop takes reports at its next turn.
//!
//! Both sides announce sleep, then look at the channel once more before blocking, with a
//! sequentially consistent fence in between, so no job or report is left without a wake-up.
//!
//! Invariant: bytes handed to a writer stay counted in their connection's output (and the output
//! budget) until a report says they are written; a connection closes only when none are left,
//! or when it is dead, and then its writer is told to forget it before the index is reused.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

/// Most buffers one vectored write takes.
pub(crate) const WRITE_SLICES: usize = 64;
const JOBS: Token = Token(usize::MAX);

/// What the loop asks of a writer.
pub enum Job {
    /// A new connection: a duplicate of its socket (nonblocking, shared with the loop's).
    Attach { index: usize, generation: u64, socket: OwnedFd },
    /// Bytes to send after those handed before; `offset` bytes of the first are sent already.
    Write { index: usize, generation: u64, buffers: VecDeque<Vec<u8>>, offset: usize },
    /// The connection closed: drop its socket and whatever is left to send.
    Forget { index: usize, generation: u64 },
}

/// Bytes of a connection written since the last report, or the socket failed.
#[derive(Clone, Copy, Debug)]
pub struct Written {
    pub index: usize,
    pub generation: u64,
    pub bytes: usize,
    pub failed: bool,
}

/// The loop's side of the writers.
pub struct Writers {
    writers: Vec<Handle>,
    reports: Receiver<Written>,
    /// The loop sleeps and needs reports to go on: writers wake it after each pass.
    want_reports: Arc<AtomicBool>,
}

struct Handle {
    jobs: Sender<Job>,
    waker: Arc<Waker>,
    sleeping: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Writers {
    /// Starts `count` writer threads; they wake the loop through `loop_waker`.
    pub fn start(count: usize, loop_waker: Arc<Waker>, spin: Duration) -> io::Result<Writers> {
        let (report_sender, reports) = channel();
        let want_reports = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::with_capacity(count);
        for number in 0..count {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), JOBS)?);
            let (jobs, job_receiver) = channel();
            let sleeping = Arc::new(AtomicBool::new(false));
            let stop = Arc::new(AtomicBool::new(false));
            let mut writer = Writer {
                poll,
                jobs: job_receiver,
                reports: report_sender.clone(),
                loop_waker: Arc::clone(&loop_waker),
                want_reports: Arc::clone(&want_reports),
                sleeping: Arc::clone(&sleeping),
                stop: Arc::clone(&stop),
                spin,
                connections: Vec::new(),
                ready: Vec::new(),
                written: Vec::new(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("kv-writer-{number}"))
                .spawn(move || writer.run())?;
            writers.push(Handle { jobs, waker, sleeping, stop, thread: Some(thread) });
        }
        Ok(Writers { writers, reports, want_reports })
    }

    fn handle(&self, index: usize) -> &Handle {
        &self.writers[index % self.writers.len()]
    }

    /// Whether the connection's writer sleeps (handing it bytes would cost a wake-up).
    pub fn sleeping(&self, index: usize) -> bool {
        self.handle(index).sleeping.load(Ordering::Relaxed)
    }

    /// Hands a job to the connection's writer, waking it if it sleeps.
    pub fn send(&self, index: usize, job: Job) {
        let handle = self.handle(index);
        // The writer outlives the loop's use of it (joined in drop): a send cannot fail.
        let _ = handle.jobs.send(job);
        fence(Ordering::SeqCst);
        if handle.sleeping.swap(false, Ordering::SeqCst) {
            let _ = handle.waker.wake();
        }
    }

    /// The next report, if any came.
    pub fn report(&self) -> Option<Written> {
        self.reports.try_recv().ok()
    }

    /// Before the loop blocks: whether writers must wake it when they report.
    pub fn want_reports(&self, want: bool) {
        self.want_reports.store(want, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }
}

impl Drop for Writers {
    fn drop(&mut self) {
        for handle in &mut self.writers {
            handle.stop.store(true, Ordering::SeqCst);
            let _ = handle.waker.wake();
            if let Some(thread) = handle.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

struct Connection {
    generation: u64,
    /// The socket as a plain descriptor: the writer only calls `writev` on it, which is the
    /// same for TCP and Unix sockets.
    socket: std::fs::File,
    pending: VecDeque<Vec<u8>>,
    /// Bytes of the first pending buffer already sent.
    offset: usize,
    /// The socket was full: wait for its writable event.
    blocked: bool,
    registered: bool,
}

struct Writer {
    poll: Poll,
    jobs: Receiver<Job>,
    reports: Sender<Written>,
    loop_waker: Arc<Waker>,
    want_reports: Arc<AtomicBool>,
    sleeping: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    spin: Duration,
    connections: Vec<Option<Connection>>,
    /// Connections with bytes to send and a socket that took the last write.
    ready: Vec<usize>,
    /// Bytes written this pass, by connection (reported at its end).
    written: Vec<Written>,
}

impl Writer {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        while !self.stop.load(Ordering::SeqCst) {
            let mut worked = self.take_jobs();
            worked |= self.write_ready();
            self.send_reports();
            if worked {
                continue;
            }
            if !self.wait_for_jobs() {
                self.sleeping.store(true, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                if self.take_jobs() || self.stop.load(Ordering::SeqCst) {
                    self.sleeping.store(false, Ordering::SeqCst);
                    continue;
                }
                if let Err(error) = self.poll.poll(&mut events, None) {
                    if error.kind() != io::ErrorKind::Interrupted {
                        tracing::error!(%error, "a reply writer's poll failed");
                        return;
                    }
                }
                self.sleeping.store(false, Ordering::SeqCst);
                self.on_events(&events);
            }
        }
    }

    /// Spins up to the configured time for a job or a writable socket; true when work came.
    fn wait_for_jobs(&mut self) -> bool {
        if self.spin.is_zero() {
            return false;
        }
        let started = Instant::now();
        let mut events = Events::with_capacity(64);
        while started.elapsed() < self.spin {
            if self.take_jobs() {
                return true;
            }
            if self.poll.poll(&mut events, Some(Duration::ZERO)).is_ok() && !events.is_empty() {
                self.on_events(&events);
                return true;
            }
            std::hint::spin_loop();
        }
        false
    }

    fn on_events(&mut self, events: &Events) {
        for event in events {
            if event.token() == JOBS {
                continue;
            }
            let index = event.token().0;
            if let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) {
                if connection.blocked {
                    connection.blocked = false;
                    self.ready.push(index);
                }
            }
        }
    }

    /// Applies every job waiting; true when there was one.
    fn take_jobs(&mut self) -> bool {
        let mut any = false;
        loop {
            match self.jobs.try_recv() {
                Ok(job) => {
                    any = true;
                    self.apply(job);
                }
                Err(TryRecvError::Empty) => return any,
                Err(TryRecvError::Disconnected) => {
                    self.stop.store(true, Ordering::SeqCst);
                    return any;
                }
            }
        }
    }

    fn apply(&mut self, job: Job) {
        match job {
            Job::Attach { index, generation, socket } => {
                if self.connections.len() <= index {
                    self.connections.resize_with(index + 1, || None);
                }
                self.forget(index);
                self.connections[index] = Some(Connection {
                    generation,
                    socket: std::fs::File::from(socket),
                    pending: VecDeque::new(),
                    offset: 0,
                    blocked: false,
                    registered: false,
                });
            }
            Job::Write { index, generation, mut buffers, offset } => {
                let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else {
                    return;
                };
                if connection.generation != generation {
                    return;
                }
                let was_idle = connection.pending.is_empty();
                if was_idle {
                    connection.offset = offset;
                }
                connection.pending.append(&mut buffers);
                if was_idle && !connection.blocked {
                    self.ready.push(index);
                }
            }
            Job::Forget { index, generation } => {
                if self
                    .connections
                    .get(index)
                    .and_then(Option::as_ref)
                    .is_some_and(|c| c.generation == generation)
                {
                    self.forget(index);
                }
            }
        }
    }

    fn forget(&mut self, index: usize) {
        if let Some(connection) = self.connections[index].take() {
            if connection.registered {
                let _ = self.poll.registry().deregister(&mut SourceFd(&connection.socket.as_raw_fd()));
            }
        }
    }

    /// Writes every ready connection until it is done or its socket is full; true if any was.
    fn write_ready(&mut self) -> bool {
        if self.ready.is_empty() {
            return false;
        }
        let mut ready = std::mem::take(&mut self.ready);
        for &index in &ready {
            self.write_connection(index);
        }
        // Writing adds no connection to `ready`: the list (and its capacity) comes back.
        ready.clear();
        self.ready = ready;
        true
    }

    fn write_connection(&mut self, index: usize) {
        let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { return };
        let mut total = 0;
        let mut failed = false;
        while !connection.pending.is_empty() {
            let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
            let count = output_slices(&connection.pending, connection.offset, &mut slices);
            match (&connection.socket).write_vectored(&slices[..count]) {
                Ok(0) => failed = true,
                Ok(written) => {
                    total += written;
                    consume(&mut connection.pending, &mut connection.offset, written);
                    continue;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    connection.blocked = true;
                    if !connection.registered {
                        let fd = connection.socket.as_raw_fd();
                        let token = Token(index);
                        match self.poll.registry().register(&mut SourceFd(&fd), token, Interest::WRITABLE) {
                            Ok(()) => connection.registered = true,
                            Err(_) => failed = true,
                        }
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => failed = true,
            }
            break;
        }
        if failed {
            connection.pending.clear();
            connection.offset = 0;
        }
        if total > 0 || failed {
            let generation = connection.generation;
            self.written.push(Written { index, generation, bytes: total, failed });
        }
    }

    fn send_reports(&mut self) {
        if self.written.is_empty() {
            return;
        }
        for report in self.written.drain(..) {
            let _ = self.reports.send(report);
        }
        fence(Ordering::SeqCst);
        if self.want_reports.load(Ordering::SeqCst) {
            let _ = self.loop_waker.wake();
        }
    }
}

/// The unsent bytes of `pending` (`offset` of the first are sent) as slices for one vectored
/// write; returns how many of `slices` it filled.
pub(crate) fn output_slices<'a>(
    pending: &'a VecDeque<Vec<u8>>,
    offset: usize,
    slices: &mut [IoSlice<'a>; WRITE_SLICES],
) -> usize {
    let mut count = 0;
    for (position, buffer) in pending.iter().take(WRITE_SLICES).enumerate() {
        let start = if position == 0 { offset } else { 0 };
        slices[count] = IoSlice::new(&buffer[start..]);
        count += 1;
    }
    count
}

/// Drops `written` bytes from the front of `pending`, whole buffers first.
pub(crate) fn consume(pending: &mut VecDeque<Vec<u8>>, offset: &mut usize, mut written: usize) {
    while written > 0 {
        let first = pending.front().expect("bytes written come from a buffer");
        let left = first.len() - *offset;
        if written < left {
            *offset += written;
            return;
        }
        written -= left;
        pending.pop_front();
        *offset = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consume_drops_whole_buffers_and_keeps_the_offset_into_the_next() {
        let mut pending: VecDeque<Vec<u8>> = [vec![1; 5], vec![2; 3], vec![3; 4]].into_iter().collect();
        let mut offset = 2;
        consume(&mut pending, &mut offset, 3 + 2);
        assert_eq!(pending.len(), 2);
        assert_eq!(offset, 2);
        consume(&mut pending, &mut offset, 1 + 4);
        assert!(pending.is_empty());
        assert_eq!(offset, 0);
    }
}
