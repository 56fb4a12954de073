//! The primary's door for a standby (seed 004, MacR; docs/KV.md "Standby"): a Unix socket in
//! the state directory, `kv-NAME/standby.sock` (0600). A standby connects and says hello with
//! its settings; the primary refuses it if a setting the takeover needs differs from its own
//! (naming each difference), else tells it the mode, the region's size and an attach id; the
//! standby creates its region (and ring) in the state directory under that id, and says it is
//! ready; the primary then mirrors every change of its backup region into the standby's, copies
//! what the region held a step at a time while it serves, and tells the standby when the copy
//! is complete. One standby at a time (one found dead at the next hello is dropped then); a lost
//! standby (its socket closed, no acknowledgement or no room in its ring for
//! [`STANDBY_TIMEOUT`]) is given up, fenced first (its files removed:
//! `crate::backup::replica`), and the primary serves on. A primary starting removes every
//! standby file it finds: the standbys of an earlier primary never take over from it.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::backup::replica::{ReplicaError, STANDBY_TIMEOUT};
use crate::backup::wire::{self, Message, Mode, PROTOCOL_VERSION};
use crate::backup::{Replica, SyncPolicy};
use crate::cache::Cache;

pub const SOCKET_FILE: &str = "standby.sock";
/// How often the primary tells an attached standby it is alive.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(250);
/// How long the sync copies per pass of the event loop (requests are served between passes).
const SYNC_STEP: Duration = Duration::from_millis(2);

/// The standby's region in the state directory, named by its attach id.
pub fn region_file(attach_id: u64) -> String {
    format!("standby-{attach_id:016x}-backup")
}

/// The standby's log ring in the state directory, named by its attach id.
pub fn ring_file(attach_id: u64) -> String {
    format!("standby-{attach_id:016x}-ring")
}

/// Whether `name` is a standby's file: of any attach, or of a remem before attach ids
/// (`standby-backup`, `standby-ring`).
fn is_standby_file(name: &str) -> bool {
    name.starts_with("standby-") && (name.ends_with("-backup") || name.ends_with("-ring"))
}

/// The settings a standby must share with its primary to take over from it: `(flag, value)`,
/// each value written as the flag takes it, in a fixed order (see `remem kv`'s
/// `standby_settings`).
pub type Settings = Vec<(String, String)>;

/// Every setting that differs, as `FLAG VALUE on the standby, VALUE on the primary`.
pub fn differences(primary: &[(String, String)], standby: &[(&str, &str)]) -> Vec<String> {
    let of_primary =
        |name: &str| primary.iter().find(|(flag, _)| flag == name).map(|(_, value)| value.as_str());
    let of_standby = |name: &str| standby.iter().find(|&&(flag, _)| flag == name).map(|&(_, value)| value);
    let mut names: Vec<&str> = primary.iter().map(|(name, _)| name.as_str()).collect();
    for &(name, _) in standby {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    fn shown(value: Option<&str>) -> &str {
        value.filter(|value| !value.is_empty()).unwrap_or("not set")
    }
    names
        .into_iter()
        .filter(|&name| of_primary(name) != of_standby(name))
        .map(|name| {
            format!(
                "{name} {} on the standby, {} on the primary",
                shown(of_standby(name)),
                shown(of_primary(name))
            )
        })
        .collect()
}

/// The PID of the process at the other end of a Unix socket (SO_PEERCRED).
pub fn peer_pid(stream: &UnixStream) -> Option<u32> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the size passed; both point to live locals.
    let result = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut credentials as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    (result == 0 && credentials.pid > 0).then_some(credentials.pid as u32)
}

/// A new attach id: random (a standby given up before must never find its files recreated by
/// a later attach).
fn new_attach_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    hasher.finish()
}

pub struct StandbyPort {
    listener: UnixListener,
    dir: PathBuf,
    mode: Mode,
    policy: SyncPolicy,
    listen: String,
    unix: String,
    /// This server's settings, which a standby's must equal.
    settings: Settings,
    attached: bool,
    /// The attached standby's process (for the log).
    standby_pid: Option<u32>,
    syncing: bool,
    last_heartbeat: Instant,
    last_progress: Instant,
    /// Standbys attached, syncs completed (for the stats).
    pub attached_total: u64,
    pub syncs_completed: u64,
}

/// Reads one frame (blocking, under the stream's timeouts) into `buffer`; returns its message
/// bytes (tag and body).
pub fn read_frame<'a>(stream: &mut UnixStream, buffer: &'a mut Vec<u8>) -> io::Result<&'a [u8]> {
    let mut header = [0u8; 4];
    stream.read_exact(&mut header)?;
    let len = wire::frame_len(&header)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?
        .expect("a whole header")
        - 4;
    buffer.resize(len, 0);
    stream.read_exact(buffer)?;
    Ok(buffer)
}

pub fn send(stream: &mut UnixStream, message: &Message) -> io::Result<()> {
    let mut out = Vec::new();
    wire::encode(message, &mut out);
    stream.write_all(&out)
}

/// Removes `path`; one already gone is no error.
fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

impl StandbyPort {
    /// Listens on `dir/standby.sock` (a stale socket there is replaced: the state directory is
    /// locked by this server), after removing every standby file in `dir`: a standby of an
    /// earlier primary (given up, or stopped while that primary died) must never take over from
    /// a copy that lacks what this server will acknowledge. Call before serving.
    pub fn bind(
        dir: &Path,
        mode: Mode,
        policy: SyncPolicy,
        (listen, unix): (String, String),
        settings: Settings,
    ) -> io::Result<StandbyPort> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_name().to_str().is_some_and(is_standby_file) {
                remove(&entry.path())?;
            }
        }
        let path = dir.join(SOCKET_FILE);
        remove(&path)?;
        let listener = UnixListener::bind(&path)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        Ok(StandbyPort {
            listener,
            dir: dir.to_owned(),
            mode,
            policy,
            listen,
            unix,
            settings,
            attached: false,
            standby_pid: None,
            syncing: false,
            last_heartbeat: Instant::now(),
            last_progress: Instant::now(),
            attached_total: 0,
            syncs_completed: 0,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// A sync is copying: the event loop should not sleep.
    pub fn busy(&self) -> bool {
        self.syncing
    }

    /// Takes the standbys waiting at the socket.
    pub fn accept(&mut self, cache: &mut Cache) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if let Err(error) = self.handshake(stream, cache) {
                        tracing::warn!(%error, "a standby could not attach");
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    tracing::warn!(%error, "accepting a standby failed");
                    return;
                }
            }
        }
    }

    fn handshake(&mut self, mut stream: UnixStream, cache: &mut Cache) -> io::Result<()> {
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(STANDBY_TIMEOUT))?;
        stream.set_write_timeout(Some(STANDBY_TIMEOUT))?;
        let pid = peer_pid(&stream);
        let mut buffer = Vec::new();
        let frame = read_frame(&mut stream, &mut buffer)?;
        let refuse = |stream: &mut UnixStream, reason: String| {
            let _ = send(stream, &Message::Refused { reason: &reason });
            Err(io::Error::other(reason))
        };
        match wire::decode(frame) {
            Ok(Message::Hello { version: PROTOCOL_VERSION, settings }) => {
                let differences = differences(&self.settings, &settings);
                if !differences.is_empty() {
                    return refuse(&mut stream, differences.join("; "));
                }
            }
            Ok(Message::Hello { version, .. }) => {
                return refuse(
                    &mut stream,
                    format!("protocol version {version}, this primary speaks {PROTOCOL_VERSION}"),
                )
            }
            other => return refuse(&mut stream, format!("expected a hello, got {other:?}")),
        }
        let Some(backup) = cache.backup_mut() else {
            return refuse(&mut stream, "this primary keeps no backup region (--ephemeral)".into());
        };
        if self.attached {
            // A standby that died right after it attached may not have been found gone yet
            // (nothing was written to it since): it is now, and this one takes its place.
            let replica = backup.replica_mut().expect("attached means a replica");
            if !replica.peer_closed() {
                let holder = self.standby_pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default();
                return refuse(&mut stream, format!("this primary has a standby already{holder}"));
            }
            replica.lose(ReplicaError::SocketClosed);
            self.detach(cache);
        }
        let backup = cache.backup_mut().expect("checked above");
        let (_, chunk_count) = backup.chunks_used();
        let region_bytes = backup.file_bytes();
        let attach_id = new_attach_id();
        send(
            &mut stream,
            &Message::Welcome {
                version: PROTOCOL_VERSION,
                mode: self.mode,
                chunk_count,
                attach_id,
                listen: &self.listen,
                unix: &self.unix,
            },
        )?;
        let (region, ring) = (self.dir.join(region_file(attach_id)), self.dir.join(ring_file(attach_id)));
        let ready =
            read_frame(&mut stream, &mut buffer).map(|frame| wire::decode(frame) == Ok(Message::Ready));
        let replica = match ready {
            Ok(true) => Replica::attach(self.mode, stream, &region, region_bytes, &ring),
            _ => Err(ReplicaError::NotReady),
        };
        let replica = replica.map_err(|error| {
            // What it may have created is of no use to anyone.
            let _ = (remove(&region), remove(&ring));
            io::Error::other(error)
        })?;
        backup.attach_replica(replica, self.policy);
        self.attached = true;
        self.standby_pid = pid;
        self.syncing = true;
        self.attached_total += 1;
        self.last_progress = Instant::now();
        eprintln!(
            "a standby{} attached ({} replication); syncing its backup region",
            pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
            self.mode.name()
        );
        Ok(())
    }

    /// Drops the standby given up (`Replica::lose` fenced it) and says so.
    fn detach(&mut self, cache: &mut Cache) {
        let Some(replica) = cache.backup_mut().and_then(|backup| backup.detach_replica()) else { return };
        eprintln!(
            "the standby{} is given up ({}): its files are removed, so it can never take over; serving \
             without one",
            self.standby_pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
            replica.lost.map(|why| why.to_string()).unwrap_or_default()
        );
        self.attached = false;
        self.standby_pid = None;
        self.syncing = false;
    }

    /// Once per pass of the event loop: a step of the sync, heartbeats, a lost standby dropped.
    pub fn step(&mut self, cache: &mut Cache) {
        if !self.attached {
            return;
        }
        let Some(backup) = cache.backup_mut() else { return };
        if let Some(progress) = backup.sync_step(SYNC_STEP) {
            let replica = backup.replica_mut().expect("a sync runs with a replica");
            // A standby given up during the sync is not synced, whatever its copy reached.
            let given_up = replica.lost.is_some();
            if progress.done && !given_up {
                self.syncing = false;
                self.syncs_completed += 1;
                replica.tell(&Message::Synced {
                    records: progress.records,
                    micros: progress.elapsed.as_micros() as u64,
                });
                eprintln!(
                    "standby synced: {} records in {} chunks ({} copied whole, {} slot by slot) in {:.3} s",
                    progress.records,
                    progress.chunks_total,
                    progress.bulk_chunks,
                    progress.item_chunks,
                    progress.elapsed.as_secs_f64()
                );
            } else if !given_up && self.last_progress.elapsed() >= Duration::from_secs(1) {
                self.last_progress = Instant::now();
                replica.tell(&Message::Progress { done: progress.chunks_done, total: progress.chunks_total });
                eprintln!(
                    "standby sync: {} of {} chunks ({:.0}%), {} records so far",
                    progress.chunks_done,
                    progress.chunks_total,
                    100.0 * progress.chunks_done as f64 / progress.chunks_total.max(1) as f64,
                    progress.records
                );
            }
        }
        if self.last_heartbeat.elapsed() >= HEARTBEAT_INTERVAL {
            self.last_heartbeat = Instant::now();
            if let Some(replica) = backup.replica_mut() {
                replica.tell(&Message::Heartbeat);
            }
        }
        if backup.replica_mut().is_some_and(|replica| replica.lost.is_some()) {
            self.detach(cache);
        }
    }
}
