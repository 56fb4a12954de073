//! `remem kv --standby`: a second `remem kv` that lends the running one (the primary of the
//! same state directory) a backup region in its own memory, waits, and takes over when the
//! primary dies (seed 004, MacR; docs/KV.md "Standby").
//!
//! While the primary lives, the standby's CPU does what the replication mode asks of it and
//! nothing else: one-sided, only heartbeats arrive (the primary stores into the region itself);
//! RPC, it applies each change and acknowledges it; log, it drains the ring by polling.
//!
//! The primary is gone when its socket closes (the kernel closes it when the process dies, so a
//! SIGKILL is seen at once) or when no heartbeat came for [`LEASE`] (a hung primary: the
//! standby SIGKILLs it, by the PID the kernel gives for the socket's peer, before it goes on).
//! A closed socket is also how a primary gives a standby up (it stopped answering in time); the
//! primary removes the standby's files first (`crate::backup::replica`, "The fence"), so a
//! standby whose region file is gone was given up and never takes over. The takeover itself
//! is a rename of the region to the state directory's `backup` under the directory's lock (the
//! primary's process is gone once the lock is free): a given-up standby's rename finds nothing.
//! Then the caller restarts from the region as any `remem kv` restarts: slab map reopened,
//! records scanned and checked, index rebuilt, on the primary's address.
//!
//! A standby that cannot take over (given up, its copy incomplete, another server holding the
//! directory) attaches again to whatever primary serves the directory, from scratch; one that
//! finds no primary says so at once and every [`WAIT_REPORT_INTERVAL`], and waits for one. Only
//! a refusal (another standby attached, other settings, another protocol) ends it with an error.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::state::KvState;
use crate::backup::replica::{Change, RingReader};
use crate::backup::wire::{self, FrameReader, Message, Mode, PROTOCOL_VERSION};
use crate::backup::{Backup, CHUNK_BYTES};
use crate::standby::{peer_pid, read_frame, region_file, ring_file, send, Settings, SOCKET_FILE};
use crate::CacheConfig;
use anyhow::{bail, Context, Result};

/// A primary silent this long is taken for dead (it heartbeats every 250 ms).
pub const LEASE: Duration = Duration::from_secs(2);
/// How often a standby that finds no primary says so.
const WAIT_REPORT_INTERVAL: Duration = Duration::from_secs(5);
/// How often it tries the primary's socket meanwhile.
const CONNECT_RETRY: Duration = Duration::from_millis(100);
/// How often a standby whose primary's socket closed tries the state directory's lock (a
/// primary found dead may still be exiting), at first; then every [`CONNECT_RETRY`].
const LOCK_RETRY: Duration = Duration::from_millis(5);
/// How long it tries that often before it says it is waiting.
const LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// What the standby learned, for the takeover.
pub struct Takeover {
    pub listen: SocketAddr,
    pub unix: Option<PathBuf>,
    pub primary_pid: Option<u32>,
    /// When the primary was found dead.
    pub detected_at: Instant,
    pub how: &'static str,
}

/// `bytes` as `-m` takes it, exactly (`256MiB`, `1536KiB`, `1000000`).
fn exact_bytes(bytes: u64) -> String {
    for (name, size) in [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{name}", bytes / size);
        }
    }
    bytes.to_string()
}

/// The settings a standby must share with its primary to take over from it: the cluster (its
/// secret reopens the slabs), the memory limit and EC shape (the regions' sizes and shapes),
/// the scheme policy (which regions exist, where items go) and the access control (a takeover
/// must not open a cache that asked for passwords). Compared by the primary at attach.
pub fn standby_settings(cluster_file: &Path, config: &CacheConfig, auth_file: Option<&Path>) -> Settings {
    let canonical =
        |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned()).display().to_string();
    let policy = &config.policy;
    let label = |scheme: crate::Scheme| scheme.label(config.ec);
    let prefixes: Vec<String> = policy
        .prefixes
        .iter()
        .map(|(prefix, scheme)| format!("{}={}", String::from_utf8_lossy(prefix), label(*scheme)))
        .collect();
    [
        ("--cluster", canonical(cluster_file)),
        ("-m", exact_bytes(config.memory_limit_bytes)),
        ("-k", config.ec.data_splits.to_string()),
        ("-r", config.ec.parity_splits.to_string()),
        ("--scheme", policy.fixed.map(label).unwrap_or_else(|| "auto".into())),
        ("--prefix-scheme", prefixes.join(" ")),
        ("--small-below", exact_bytes(policy.small_below_bytes as u64)),
        ("--small-scheme", label(policy.small_scheme)),
        ("--large-scheme", label(policy.large_scheme)),
        ("--cold-after-secs", policy.cold_after.as_secs().to_string()),
        ("--hot-reads", policy.hot_reads.to_string()),
        ("--auth-file", auth_file.map(canonical).unwrap_or_default()),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect()
}

/// Why no primary answers at `socket` (for the operator: a mistyped `--name` shows here).
fn why_no_primary(dir: &Path, socket: &Path, error: &io::Error) -> String {
    if !dir.is_dir() {
        let mut why = format!(
            "{} does not exist: no remem kv ran with this --name (or --state) on this cluster",
            dir.display()
        );
        let parent = dir.parent().unwrap_or(Path::new("."));
        let mut names: Vec<String> = std::fs::read_dir(parent)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.path().is_dir())
            .filter_map(|entry| entry.file_name().to_str()?.strip_prefix("kv-").map(str::to_owned))
            .collect();
        names.sort();
        if !names.is_empty()
            && dir.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.starts_with("kv-"))
        {
            why += &format!(" (--name of those that did: {})", names.join(", "));
        }
        return why;
    }
    match error.kind() {
        io::ErrorKind::NotFound => format!(
            "{} does not exist: no remem kv serves {} (not started yet, or --ephemeral)",
            socket.display(),
            dir.display()
        ),
        io::ErrorKind::ConnectionRefused => {
            format!(
                "nothing listens on {}: the remem kv of {} stopped or died",
                socket.display(),
                dir.display()
            )
        }
        _ => format!("{}: {error}", socket.display()),
    }
}

/// Connects to the primary of `dir`, waiting as long as it takes: what is missing is said at
/// once, and again every [`WAIT_REPORT_INTERVAL`] (or when it changes).
fn connect_waiting(dir: &Path) -> UnixStream {
    let path = dir.join(SOCKET_FILE);
    let started = Instant::now();
    let mut said: Option<(Instant, String)> = None;
    loop {
        match UnixStream::connect(&path) {
            Ok(stream) => {
                if said.is_some() {
                    eprintln!("a primary listens on {} now; attaching", path.display());
                }
                return stream;
            }
            Err(error) => {
                let why = why_no_primary(dir, &path, &error);
                let due = said
                    .as_ref()
                    .is_none_or(|(at, before)| at.elapsed() >= WAIT_REPORT_INTERVAL || *before != why);
                if due {
                    if said.is_none() {
                        eprintln!("no primary to stand by for: {why}; waiting for one");
                    } else {
                        eprintln!(
                            "still no primary to stand by for after {} s: {why}; waiting",
                            started.elapsed().as_secs()
                        );
                    }
                    said = Some((Instant::now(), why));
                }
                std::thread::sleep(CONNECT_RETRY);
            }
        }
    }
}

/// A standby attached to a primary: its region (and ring), named by the attach id.
struct Attached {
    stream: UnixStream,
    primary_pid: Option<u32>,
    mode: Mode,
    listen: SocketAddr,
    unix: Option<PathBuf>,
    region_path: PathBuf,
    ring_path: PathBuf,
    region: Backup,
    ring: Option<RingReader>,
}

/// How standing by ended.
struct Ended {
    how: &'static str,
    synced: bool,
    /// The primary removed this standby's region: it gave the standby up.
    given_up: bool,
}

/// An attach that did not happen, and whether trying again may help.
enum NotAttached {
    /// The primary went away during the hello (it died, or gave up on a slow standby).
    Retry(String),
    Refused(anyhow::Error),
}

impl Attached {
    fn attach(mut stream: UnixStream, dir: &Path, settings: &Settings) -> Result<Attached, NotAttached> {
        let primary_pid = peer_pid(&stream);
        let retry = |what: &str, error: io::Error| NotAttached::Retry(format!("{what}: {error}"));
        let timeout = Some(Duration::from_secs(5));
        stream.set_read_timeout(timeout).map_err(|error| retry("socket", error))?;
        stream.set_write_timeout(timeout).map_err(|error| retry("socket", error))?;
        let settings: Vec<(&str, &str)> =
            settings.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
        send(&mut stream, &Message::Hello { version: PROTOCOL_VERSION, settings })
            .map_err(|error| retry("saying hello", error))?;
        let mut buffer = Vec::new();
        let frame =
            read_frame(&mut stream, &mut buffer).map_err(|error| retry("waiting for the welcome", error))?;
        let refused = |error: anyhow::Error| NotAttached::Refused(error);
        let (mode, chunk_count, attach_id, listen, unix) = match wire::decode(frame) {
            Ok(Message::Welcome {
                version: PROTOCOL_VERSION,
                mode,
                chunk_count,
                attach_id,
                listen,
                unix,
            }) => (mode, chunk_count, attach_id, listen.to_owned(), unix.to_owned()),
            Ok(Message::Refused { reason }) => {
                return Err(refused(anyhow::anyhow!(
                    "standby refused by the primary{} of {}: {reason}",
                    primary_pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
                    dir.display()
                )))
            }
            other => return Err(refused(anyhow::anyhow!("the primary answered the hello with {other:?}"))),
        };
        let listen: SocketAddr = listen
            .parse()
            .map_err(|_| refused(anyhow::anyhow!("the primary's address {listen:?} is not one")))?;
        let unix = (!unix.is_empty()).then(|| PathBuf::from(unix));
        let region_path = dir.join(region_file(attach_id));
        let ring_path = dir.join(ring_file(attach_id));
        let region = Backup::create(&region_path, chunk_count as u64 * CHUNK_BYTES as u64)
            .map_err(|error| refused(error.into()))?;
        if region.chunks_used().1 != chunk_count {
            return Err(refused(anyhow::anyhow!(
                "the primary's region has {chunk_count} chunks, more than a region may have"
            )));
        }
        let ring = match mode {
            Mode::Log => Some(
                RingReader::create(&ring_path)
                    .with_context(|| format!("creating {}", ring_path.display()))
                    .map_err(refused)?,
            ),
            _ => None,
        };
        let mut attached =
            Attached { stream, primary_pid, mode, listen, unix, region_path, ring_path, region, ring };
        if let Err(error) = send(&mut attached.stream, &Message::Ready) {
            attached.remove_files();
            return Err(retry("saying it is ready", error));
        }
        eprintln!(
            "standing by for the primary{} of {} ({} replication, {} chunks of backup region); syncing",
            primary_pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
            dir.display(),
            mode.name(),
            chunk_count
        );
        Ok(attached)
    }

    /// Whether the primary removed this standby's region (the fence: it gave the standby up).
    fn fenced(&self) -> bool {
        matches!(std::fs::symlink_metadata(&self.region_path), Err(error) if error.kind() == io::ErrorKind::NotFound)
    }

    /// Removes what this standby created (a copy that will never be taken over).
    fn remove_files(&self) {
        let _ = std::fs::remove_file(&self.region_path);
        let _ = std::fs::remove_file(&self.ring_path);
    }

    /// Applies what the primary sends until it is gone or gives this standby up.
    fn stand(&mut self, gauges: &StandbyGauges) -> Result<Ended> {
        self.stream.set_nonblocking(true)?;
        let mut reader = FrameReader::default();
        let mut last_heard = Instant::now();
        let mut synced = false;
        let mut out = Vec::new();
        let poll_timeout = if self.mode == Mode::Log { 0 } else { 100 };
        let how = 'standing: loop {
            if let Some(ring) = self.ring.as_mut() {
                let applied = ring.drain(|change| self.region.apply(change))?;
                gauges.applied(applied as u64);
                if applied == 0 {
                    // The log baseline polls: a short sleep when the ring is empty.
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            let mut poll = libc::pollfd { fd: self.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd, a live local.
            unsafe { libc::poll(&mut poll, 1, poll_timeout) };
            match reader.fill(&mut self.stream) {
                Ok(0) => break "its socket closed",
                Ok(_) => {
                    last_heard = Instant::now();
                    gauges.heard();
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break "its socket failed",
            }
            while let Some(frame) = reader.next_frame().map_err(anyhow::Error::msg)? {
                match wire::decode(frame).map_err(anyhow::Error::msg)? {
                    Message::Heartbeat => {}
                    Message::Progress { done, total } => eprintln!("standby sync: {done} of {total} chunks"),
                    Message::Synced { records, micros } => {
                        synced = true;
                        gauges.synced.store(true, Ordering::Relaxed);
                        eprintln!("standby synced: {records} records copied in {:.3} s", micros as f64 / 1e6);
                    }
                    Message::Write { offset, bytes } => {
                        self.region.apply(Change::Write { offset, bytes })?;
                        gauges.applied(1);
                    }
                    Message::State { offset, state } => {
                        self.region.apply(Change::State { offset, state })?;
                        gauges.applied(1);
                    }
                    Message::Barrier { seq } => {
                        out.clear();
                        wire::encode(&Message::Ack { seq }, &mut out);
                        // A primary that dies while its acknowledgement is written fails the
                        // write (EPIPE, ECONNRESET): that is the primary gone, as a failed read is.
                        if write_all_nonblocking(&mut self.stream, &out).is_err() {
                            break 'standing "its socket failed while acknowledging";
                        }
                    }
                    other => bail!("unexpected message from the primary: {other:?}"),
                }
            }
            if last_heard.elapsed() > LEASE {
                // This process may have been the one stopped (SIGSTOP, a stall): what the
                // primary sent meanwhile is waiting on the socket, and one that gave this
                // standby up has removed its region. Only a primary silent now is hung.
                match reader.fill(&mut self.stream) {
                    Ok(0) => break "its socket closed",
                    Ok(_) => {
                        last_heard = Instant::now();
                        continue;
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break "its socket failed",
                }
                if self.fenced() {
                    break "it gave this standby up";
                }
                if let Some(pid) = self.primary_pid {
                    eprintln!(
                        "the primary (pid {pid}) sent nothing for {LEASE:?}: killing it before taking over"
                    );
                    // SAFETY: kill with the PID the kernel named as the socket's peer.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                break "its heartbeats stopped";
            }
        };
        // What the primary appended before it died is in the ring (the standby's memory).
        if let Some(ring) = self.ring.as_mut() {
            ring.drain(|change| self.region.apply(change))?;
        }
        // The primary removes the region before it closes the socket of a standby it gives up.
        Ok(Ended { how, synced, given_up: self.fenced() })
    }
}

/// The state directory's lock, once the process holding it (the primary) is gone; None if this
/// standby's region is removed meanwhile (a primary gave it up, or a new one started and will
/// serve what this copy lacks). Waits as long as it takes, saying so every
/// [`WAIT_REPORT_INTERVAL`] after [`LOCK_PATIENCE`].
fn lock_unless_fenced(dir: &Path, attached: &Attached) -> Option<KvState> {
    let started = Instant::now();
    let mut said: Option<Instant> = None;
    loop {
        let error = match KvState::lock(dir) {
            Ok(state) => return Some(state),
            Err(error) => error,
        };
        if attached.fenced() {
            return None;
        }
        if started.elapsed() < LOCK_PATIENCE {
            std::thread::sleep(LOCK_RETRY);
            continue;
        }
        if said.is_none_or(|at| at.elapsed() >= WAIT_REPORT_INTERVAL) {
            eprintln!(
                "the primary's socket closed, but the state directory is not free yet ({error:#}); waiting"
            );
            said = Some(Instant::now());
        }
        std::thread::sleep(CONNECT_RETRY);
    }
}

/// What a standby shows on its metrics endpoint until it takes over (the primary's metrics
/// after): whether it is attached and synced, what it applied, when it last heard the primary.
/// Atomics written by the standing loop and read by the metrics thread.
pub struct StandbyGauges {
    started: Instant,
    attached: AtomicBool,
    synced: AtomicBool,
    attaches: AtomicU64,
    changes_applied: AtomicU64,
    /// Milliseconds from `started` to the last frame from the primary (0: none yet).
    last_heard_ms: AtomicU64,
}

impl Default for StandbyGauges {
    fn default() -> Self {
        StandbyGauges {
            started: Instant::now(),
            attached: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            attaches: AtomicU64::new(0),
            changes_applied: AtomicU64::new(0),
            last_heard_ms: AtomicU64::new(0),
        }
    }
}

impl StandbyGauges {
    fn heard(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX).max(1);
        self.last_heard_ms.store(ms, Ordering::Relaxed);
    }

    fn applied(&self, changes: u64) {
        self.changes_applied.fetch_add(changes, Ordering::Relaxed);
    }

    /// The Prometheus text of a standby that has not taken over.
    pub fn render(&self) -> String {
        let heard = self.last_heard_ms.load(Ordering::Relaxed);
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let since = if heard == 0 { now } else { now.saturating_sub(heard) };
        let flag = |flag: &AtomicBool| if flag.load(Ordering::SeqCst) { 1.0 } else { 0.0 };
        let mut text = remem_frontend::metrics::Exposition::default();
        text.gauge("remem_kv_standby_attached", "1 while attached to a primary.", flag(&self.attached))
            .gauge(
                "remem_kv_standby_synced",
                "1 once the copy of the primary's backup region is complete (a takeover serves every \
                 acknowledged item).",
                flag(&self.synced),
            )
            .counter(
                "remem_kv_standby_attaches_total",
                "Times this standby attached to a primary.",
                self.attaches.load(Ordering::Relaxed) as f64,
            )
            .counter(
                "remem_kv_standby_changes_applied_total",
                "Writes and slot states of the primary applied to the copy.",
                self.changes_applied.load(Ordering::Relaxed) as f64,
            )
            .gauge(
                "remem_kv_standby_primary_silence_seconds",
                "Seconds since the primary last sent anything (since the start before the first).",
                since as f64 / 1000.0,
            );
        text.finish()
    }
}

/// Attaches to the primary of `dir` and stands by until it dies with this standby's copy
/// complete and vouched for; returns where to serve, with the state directory locked and the
/// copy made its backup region. Errors if a primary refuses this standby.
pub fn stand_by(dir: &Path, settings: &Settings, gauges: &StandbyGauges) -> Result<(Takeover, KvState)> {
    let plain_restart = format!(
        "its own backup region is complete: a plain `remem kv` with its flags on {} restores every item \
         it acknowledged, and this standby attaches to it",
        dir.display()
    );
    loop {
        let stream = connect_waiting(dir);
        let mut attached = match Attached::attach(stream, dir, settings) {
            Ok(attached) => attached,
            Err(NotAttached::Refused(error)) => return Err(error),
            Err(NotAttached::Retry(why)) => {
                eprintln!("attaching failed ({why}); trying again");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        gauges.attaches.fetch_add(1, Ordering::Relaxed);
        gauges.attached.store(true, Ordering::Relaxed);
        gauges.heard();
        let ended = attached.stand(gauges);
        // Not synced first: a scrape in between must not see synced while not attached.
        gauges.synced.store(false, Ordering::SeqCst);
        gauges.attached.store(false, Ordering::SeqCst);
        let Ended { how, synced, given_up } = ended?;
        let detected_at = Instant::now();
        if !synced && !given_up {
            eprintln!(
                "the primary is gone ({how}) before this standby's copy was complete: not taking over; \
                 {plain_restart}"
            );
            attached.remove_files();
            continue;
        }
        // The primary's process is gone once its lock is free; under the lock nothing but this
        // process changes the directory, so the rename below is the takeover's last check.
        let state = if given_up { None } else { lock_unless_fenced(dir, &attached) };
        let Some(state) = state else {
            eprintln!(
                "this standby was given up ({how}; its region {} is removed: the primary gave it up, or a \
                 primary started since): this copy lacks what the primary acknowledged since and is never \
                 taken over; attaching again, from scratch",
                attached.region_path.display()
            );
            attached.remove_files();
            continue;
        };
        let Attached { region, region_path, ring_path, listen, unix, primary_pid, .. } = attached;
        drop(region);
        match std::fs::rename(&region_path, state.backup_path()) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let _ = std::fs::remove_file(&ring_path);
                drop(state);
                eprintln!(
                    "this standby was given up before its primary died ({} is removed): this copy lacks \
                     what the primary acknowledged since and is never taken over; {plain_restart}",
                    region_path.display()
                );
                continue;
            }
            Err(error) => {
                return Err(error)
                    .with_context(|| format!("making {} the backup region", region_path.display()))
            }
        }
        let _ = std::fs::remove_file(&ring_path);
        eprintln!("the primary is gone ({how}); taking over on {listen}");
        return Ok((Takeover { listen, unix, primary_pid, detected_at, how }, state));
    }
}

fn write_all_nonblocking(stream: &mut UnixStream, mut bytes: &[u8]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !bytes.is_empty() {
        match io::Write::write(stream, bytes) {
            Ok(0) => bail!("the primary's socket closed"),
            Ok(written) => bytes = &bytes[written..],
            Err(error) if error.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(20))
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}
