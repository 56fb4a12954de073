//! `remem kv --standby`: a second `remem kv` that lends the running one (the primary of the
//! same state directory) a backup region in its own memory, waits, and takes over when the
//! primary dies (seed 004, MacR; docs/KV.md "Standby").
//!
//! While the primary lives, the standby's CPU does what the replication mode asks of it and
//! nothing else: one-sided, only heartbeats arrive (the primary stores into the region itself);
//! RPC, it applies each change and acknowledges it; log, it drains the ring by polling.
//!
//! The primary is dead when its socket closes (the kernel closes it when the process dies, so a
//! SIGKILL is seen at once) or when no heartbeat came for [`LEASE`] (a hung primary: the
//! standby SIGKILLs it, by the PID the kernel gives for the socket's peer, before it goes on;
//! the state directory's lock then tells when it is really gone). Then the standby, if its copy
//! was complete, makes its region the state directory's backup region, and the caller restarts
//! from it as any `remem kv` restarts: slab map reopened, records scanned and checked, index
//! rebuilt, on the primary's address.
//!
//! A standby that finds no primary says so at once, and again every [`WAIT_REPORT_INTERVAL`],
//! and waits for one (it may be started before its primary; a mistyped `--name` shows).

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use remem_kv::backup::replica::{Change, RingReader};
use remem_kv::backup::wire::{self, FrameReader, Message, Mode, PROTOCOL_VERSION};
use remem_kv::backup::{Backup, CHUNK_BYTES};
use remem_kv::standby::{peer_pid, read_frame, region_file, ring_file, send, Settings, SOCKET_FILE};
use remem_kv::CacheConfig;

/// A primary silent this long is taken for dead (it heartbeats every 250 ms).
pub const LEASE: Duration = Duration::from_secs(2);
/// How often a standby that finds no primary says so.
const WAIT_REPORT_INTERVAL: Duration = Duration::from_secs(5);
/// How often it tries the primary's socket meanwhile.
const CONNECT_RETRY: Duration = Duration::from_millis(100);

/// What the standby learned, for the takeover.
pub struct Takeover {
    pub listen: SocketAddr,
    pub unix: Option<PathBuf>,
    pub primary_pid: Option<u32>,
    /// When the primary was found dead.
    pub detected_at: Instant,
    pub how: &'static str,
    /// This standby's region and ring in the state directory.
    region: PathBuf,
    ring: PathBuf,
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
    let label = |scheme: remem_kv::Scheme| scheme.label(config.ec);
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

/// Attaches to the primary of `dir` and stands by until it dies; returns where to serve. Errors
/// if the primary refuses, or dies before the standby's copy is complete (nothing to take
/// over from: a plain restart of `remem kv` restores from the primary's own region).
pub fn stand_by(dir: &Path, settings: &Settings) -> Result<Takeover> {
    let mut stream = connect_waiting(dir);
    let primary_pid = peer_pid(&stream);
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let settings = settings.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    send(&mut stream, &Message::Hello { version: PROTOCOL_VERSION, settings })?;
    let mut buffer = Vec::new();
    let frame = read_frame(&mut stream, &mut buffer).context("waiting for the primary's welcome")?;
    let (mode, chunk_count, attach_id, listen, unix) = match wire::decode(frame) {
        Ok(Message::Welcome { version: PROTOCOL_VERSION, mode, chunk_count, attach_id, listen, unix }) => {
            (mode, chunk_count, attach_id, listen.to_owned(), unix.to_owned())
        }
        Ok(Message::Refused { reason }) => bail!(
            "standby refused by the primary{} of {}: {reason}",
            primary_pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
            dir.display()
        ),
        other => bail!("the primary answered the hello with {other:?}"),
    };
    let listen: SocketAddr =
        listen.parse().with_context(|| format!("the primary's address {listen:?} is not one"))?;
    let unix = (!unix.is_empty()).then(|| PathBuf::from(unix));
    let region_path = dir.join(region_file(attach_id));
    let ring_path = dir.join(ring_file(attach_id));
    let mut region = Backup::create(&region_path, chunk_count as u64 * CHUNK_BYTES as u64)?;
    if region.chunks_used().1 != chunk_count {
        bail!("the primary's region has {chunk_count} chunks, more than a region may have");
    }
    let mut ring = match mode {
        Mode::Log => Some(RingReader::create(&ring_path)?),
        _ => None,
    };
    send(&mut stream, &Message::Ready)?;
    eprintln!(
        "standing by for the primary{} of {} ({} replication, {} chunks of backup region); syncing",
        primary_pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
        dir.display(),
        mode.name(),
        chunk_count
    );

    stream.set_nonblocking(true)?;
    let mut reader = FrameReader::default();
    let mut last_heard = Instant::now();
    let mut synced = false;
    let mut out = Vec::new();
    let poll_timeout = if mode == Mode::Log { 0 } else { 100 };
    let how = 'standing: loop {
        if let Some(ring) = ring.as_mut() {
            let applied = ring.drain(|change| region.apply(change)).map_err(anyhow::Error::msg)?;
            if applied == 0 {
                // The log baseline polls: a short sleep when the ring is empty.
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        let mut poll = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, a live local.
        unsafe { libc::poll(&mut poll, 1, poll_timeout) };
        match reader.fill(&mut stream) {
            Ok(0) => break "its socket closed",
            Ok(_) => last_heard = Instant::now(),
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
                    eprintln!("standby synced: {records} records copied in {:.3} s", micros as f64 / 1e6);
                }
                Message::Write { offset, bytes } => {
                    region.apply(Change::Write { offset, bytes }).map_err(anyhow::Error::msg)?
                }
                Message::State { offset, state } => {
                    region.apply(Change::State { offset, state }).map_err(anyhow::Error::msg)?
                }
                Message::Barrier { seq } => {
                    out.clear();
                    wire::encode(&Message::Ack { seq }, &mut out);
                    // A primary that dies while its acknowledgement is written fails the write
                    // (EPIPE, ECONNRESET): that is the primary gone, as a failed read is.
                    if write_all_nonblocking(&mut stream, &out).is_err() {
                        break 'standing "its socket failed while acknowledging";
                    }
                }
                other => bail!("unexpected message from the primary: {other:?}"),
            }
        }
        if last_heard.elapsed() > LEASE {
            if let Some(pid) = primary_pid {
                eprintln!(
                    "the primary (pid {pid}) sent nothing for {LEASE:?}: killing it before taking over"
                );
                // SAFETY: kill with the PID the kernel named as the socket's peer.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            break "its heartbeats stopped";
        }
    };
    let detected_at = Instant::now();
    // What the primary appended before it died is in the ring (the standby's memory).
    if let Some(ring) = ring.as_mut() {
        ring.drain(|change| region.apply(change)).map_err(anyhow::Error::msg)?;
    }
    drop(region);
    if !synced {
        bail!(
            "the primary died ({how}) before this standby's copy was complete: not taking over. A plain \
             `remem kv` on the same state directory restores from the primary's own backup region"
        );
    }
    eprintln!("the primary is gone ({how}); taking over on {listen}");
    Ok(Takeover { listen, unix, primary_pid, detected_at, how, region: region_path, ring: ring_path })
}

/// The standby's region becomes the state directory's backup region (call with the directory
/// locked: the primary is gone).
pub fn adopt_region(takeover: &Takeover, backup_path: &Path) -> Result<()> {
    std::fs::rename(&takeover.region, backup_path)
        .with_context(|| format!("making {} the backup region", takeover.region.display()))?;
    let _ = std::fs::remove_file(&takeover.ring);
    Ok(())
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
