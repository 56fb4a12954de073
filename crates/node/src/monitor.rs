//! The Resource Monitor (seed 000 §3.2 and §4.2 "Adaptive Slab Allocation/Eviction"): keeps a
//! free-memory headroom on the host for local applications.
//!
//! Every control period one thread reads the host's memory from the tightest source it found at
//! startup (a cgroup v2 or v1 memory limit of the node's own cgroup or its nearest limited
//! ancestor, else `/proc/meminfo`) and compares what is free with the headroom (a percentage of
//! the limit):
//! - below the headroom it frees pre-allocated slabs first, then evicts mapped ones by
//!   decentralized batch eviction: E + E' mapped slabs sampled at random, the E least active
//!   evicted (`Shared::evict_slab`, which tells the owner first), E being the slabs that bring the
//!   host back above the headroom; and no fresh slab is mapped until the next reading.
//! - above it, it lets `MapSlab` take fresh memory down to the headroom and keeps a small pool of
//!   pre-allocated, populated slabs so that a `MapSlab` does not wait for the kernel to fault
//!   memory in.
//!
//! Activity is the number of requests the node served on a slab during the last period: on TCP
//! the node sees every request, so each slab counts them with one relaxed atomic increment on the
//! data path (`Slab::record_request`) and the monitor swaps the counters to zero each period. A
//! one-sided transport (shared memory, RDMA) would not see requests and would have to ask the
//! owners, as the seed does.
//!
//! Fault model: the files read are the kernel's, but parsing treats them as untrusted text:
//! garbage, missing fields and numbers beyond 64 bits are errors (a period without action and a
//! warning), never a panic. Invariants: `--capacity` still caps pool plus mapped slabs (the
//! table enforces it); the pool only holds fresh mappings; the loop runs at most once per period
//! and each period does bounded work (at most E + E' samples, the pool target of fills).

use crate::core::SlabActivity;
use crate::shared::Shared;
use rand::seq::SliceRandom;
use remem_proto::Control;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the monitor thread looks at the node's stop flag while it waits for a period.
const STOP_POLL: Duration = Duration::from_millis(50);
/// A cgroup limit at or above this is "no limit": cgroup v1 reports an unlimited group as
/// 9223372036854771712 (i64::MAX rounded down to a page), and no host has 4 EiB.
const UNLIMITED_FLOOR_BYTES: u64 = 1 << 62;
/// Deepest cgroup path the monitor walks up from.
const MAX_CGROUP_DEPTH: usize = 64;

/// The knobs of the monitor. Defaults are the seed's (§7): 1 s period, 25% headroom, E' = 2.
#[derive(Clone, Debug)]
pub struct ResourceMonitorConfig {
    /// The control period: how often host memory is read and acted on.
    pub period: Duration,
    /// Free memory kept for local applications, in percent of the limit (0..=90).
    pub headroom_percent: u8,
    /// E': extra slabs sampled beyond the E to evict, so the least active E can be chosen.
    pub eviction_extra: u32,
    /// Most pre-allocated slabs kept ready for `MapSlab` (0 turns pre-allocation off).
    pub prealloc_slabs: u32,
    /// Where `/proc` and `/sys/fs/cgroup` are looked up: `/`, or a fake tree in tests.
    pub filesystem_root: PathBuf,
}

impl Default for ResourceMonitorConfig {
    fn default() -> Self {
        ResourceMonitorConfig {
            period: Duration::from_secs(1),
            headroom_percent: 25,
            eviction_extra: 2,
            prealloc_slabs: 2,
            filesystem_root: PathBuf::from("/"),
        }
    }
}

impl ResourceMonitorConfig {
    /// Errors: a message naming the knob out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&self.period) {
            return Err(format!("monitor period {:?} must be in 10ms..=1h", self.period));
        }
        if self.headroom_percent > 90 {
            return Err(format!("headroom {}% must be at most 90%", self.headroom_percent));
        }
        if self.eviction_extra > 64 || self.prealloc_slabs > 64 {
            return Err("eviction extra and pre-allocated slabs must be at most 64".to_owned());
        }
        Ok(())
    }
}

/// Why host memory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MemoryReadError {
    #[error("reading {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{what}: {text:?} is not a byte count")]
    NotANumber { what: &'static str, text: String },
    #[error("{what}: {value} {unit} does not fit in 64 bits of bytes")]
    Overflow { what: &'static str, value: u64, unit: &'static str },
    #[error("/proc/meminfo has no {field} line")]
    MissingField { field: &'static str },
    #[error("/proc/meminfo: MemAvailable {available_bytes} exceeds MemTotal {total_bytes}")]
    Inconsistent { total_bytes: u64, available_bytes: u64 },
    #[error("{path}: the cgroup limit was removed")]
    LimitRemoved { path: PathBuf },
}

/// The node's cgroups, from `/proc/self/cgroup`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupMembership {
    /// Path in the unified (v2) hierarchy: the `0::PATH` line.
    pub unified_path: Option<String>,
    /// Path in the v1 hierarchy that has the `memory` controller.
    pub memory_v1_path: Option<String>,
}

/// Parses `/proc/self/cgroup` (`ID:CONTROLLERS:PATH` per line). Lines that do not fit, and paths
/// that are not absolute or climb with `..`, are ignored.
pub fn parse_proc_self_cgroup(text: &str) -> CgroupMembership {
    let mut membership = CgroupMembership::default();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if !path.starts_with('/') || path.split('/').any(|part| part == "..") {
            continue;
        }
        if id == "0" && controllers.is_empty() {
            membership.unified_path = Some(path.to_owned());
        } else if controllers.split(',').any(|controller| controller == "memory") {
            membership.memory_v1_path = Some(path.to_owned());
        }
    }
    membership
}

/// Parses a cgroup limit file (`memory.max` or `memory.limit_in_bytes`): `Some(bytes)`, or `None`
/// for no limit (`max`, or cgroup v1's near-2^63 "unlimited").
///
/// Errors: `NotANumber` for anything else, including numbers beyond 64 bits.
pub fn parse_cgroup_limit(what: &'static str, text: &str) -> Result<Option<u64>, MemoryReadError> {
    let trimmed = text.trim();
    if trimmed == "max" {
        return Ok(None);
    }
    let bytes = parse_cgroup_bytes(what, trimmed)?;
    Ok((bytes < UNLIMITED_FLOOR_BYTES).then_some(bytes))
}

/// Parses a cgroup usage file (`memory.current` or `memory.usage_in_bytes`).
///
/// Errors: `NotANumber` unless the text is one decimal u64.
pub fn parse_cgroup_bytes(what: &'static str, text: &str) -> Result<u64, MemoryReadError> {
    let trimmed = text.trim();
    trimmed.parse().map_err(|_| MemoryReadError::NotANumber { what, text: shorten(trimmed) })
}

/// What `/proc/meminfo` says, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    pub total_bytes: u64,
    pub available_bytes: u64,
}

/// Parses `MemTotal` and `MemAvailable` out of `/proc/meminfo` (`Name:   value kB` lines).
///
/// Errors: `MissingField` if either is absent, `NotANumber` or `Overflow` for a bad value,
/// `Inconsistent` if more is available than exists.
pub fn parse_meminfo(text: &str) -> Result<MemInfo, MemoryReadError> {
    let mut total_bytes = None;
    let mut available_bytes = None;
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else { continue };
        let (what, target) = match name {
            "MemTotal" => ("MemTotal", &mut total_bytes),
            "MemAvailable" => ("MemAvailable", &mut available_bytes),
            _ => continue,
        };
        *target = Some(parse_kibibytes(what, value)?);
    }
    let total_bytes = total_bytes.ok_or(MemoryReadError::MissingField { field: "MemTotal" })?;
    let available_bytes = available_bytes.ok_or(MemoryReadError::MissingField { field: "MemAvailable" })?;
    if available_bytes > total_bytes {
        return Err(MemoryReadError::Inconsistent { total_bytes, available_bytes });
    }
    Ok(MemInfo { total_bytes, available_bytes })
}

/// `   24684084 kB` -> bytes.
fn parse_kibibytes(what: &'static str, value: &str) -> Result<u64, MemoryReadError> {
    let trimmed = value.trim();
    let number = trimmed.strip_suffix("kB").map(str::trim_end).unwrap_or(trimmed);
    let kibibytes: u64 =
        number.parse().map_err(|_| MemoryReadError::NotANumber { what, text: shorten(trimmed) })?;
    kibibytes.checked_mul(1024).ok_or(MemoryReadError::Overflow { what, value: kibibytes, unit: "kB" })
}

/// Error messages quote at most 64 characters of a bad file.
fn shorten(text: &str) -> String {
    text.chars().take(64).collect()
}

/// One reading of host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryReading {
    /// The memory the node's applications may use in all: the cgroup limit or MemTotal.
    pub limit_bytes: u64,
    /// What is still free of it: limit minus usage, or MemAvailable.
    pub free_bytes: u64,
}

/// Where the monitor reads host memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// A cgroup v2 directory with `memory.max` and `memory.current`.
    CgroupV2 { dir: PathBuf },
    /// A cgroup v1 memory directory with `memory.limit_in_bytes` and `memory.usage_in_bytes`.
    CgroupV1 { dir: PathBuf },
    /// `/proc/meminfo`: MemTotal and MemAvailable.
    MemInfo { path: PathBuf },
}

impl fmt::Display for MemorySource {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemorySource::CgroupV2 { dir } => write!(formatter, "cgroup v2 {}", dir.display()),
            MemorySource::CgroupV1 { dir } => write!(formatter, "cgroup v1 {}", dir.display()),
            MemorySource::MemInfo { path } => write!(formatter, "{}", path.display()),
        }
    }
}

impl MemorySource {
    /// Chooses the source: the node's cgroup (v2 first, then v1), or its nearest ancestor, that
    /// has a memory limit below MemTotal; else `/proc/meminfo`.
    ///
    /// Errors: only if `/proc/meminfo` cannot be read or parsed (then nothing can be).
    pub fn detect(root: &Path) -> Result<MemorySource, MemoryReadError> {
        let meminfo = MemorySource::MemInfo { path: root.join("proc/meminfo") };
        let host = meminfo.read()?;
        let membership = std::fs::read_to_string(root.join("proc/self/cgroup"))
            .map(|text| parse_proc_self_cgroup(&text))
            .unwrap_or_default();
        let limited_below_host =
            |limit: Option<u64>| matches!(limit, Some(bytes) if bytes < host.limit_bytes);
        if let Some(path) = &membership.unified_path {
            for mount in ["sys/fs/cgroup", "sys/fs/cgroup/unified"] {
                let found = nearest_limited(&root.join(mount), path, "memory.max", limited_below_host);
                if let Some(dir) = found {
                    return Ok(MemorySource::CgroupV2 { dir });
                }
            }
        }
        if let Some(path) = &membership.memory_v1_path {
            let mount = root.join("sys/fs/cgroup/memory");
            if let Some(dir) = nearest_limited(&mount, path, "memory.limit_in_bytes", limited_below_host) {
                return Ok(MemorySource::CgroupV1 { dir });
            }
        }
        Ok(meminfo)
    }

    /// Reads the source once.
    ///
    /// Errors: the file could not be read or parsed, or the cgroup lost its limit.
    pub fn read(&self) -> Result<MemoryReading, MemoryReadError> {
        let (dir, limit_file, usage_file) = match self {
            MemorySource::MemInfo { path } => {
                let info = parse_meminfo(&read_text(path)?)?;
                return Ok(MemoryReading { limit_bytes: info.total_bytes, free_bytes: info.available_bytes });
            }
            MemorySource::CgroupV2 { dir } => (dir, "memory.max", "memory.current"),
            MemorySource::CgroupV1 { dir } => (dir, "memory.limit_in_bytes", "memory.usage_in_bytes"),
        };
        let limit_path = dir.join(limit_file);
        let limit_bytes = parse_cgroup_limit(limit_file, &read_text(&limit_path)?)?
            .ok_or(MemoryReadError::LimitRemoved { path: limit_path })?;
        let usage_bytes = parse_cgroup_bytes(usage_file, &read_text(&dir.join(usage_file))?)?;
        Ok(MemoryReading { limit_bytes, free_bytes: limit_bytes.saturating_sub(usage_bytes) })
    }
}

fn read_text(path: &Path) -> Result<String, MemoryReadError> {
    std::fs::read_to_string(path).map_err(|source| MemoryReadError::Io { path: path.to_owned(), source })
}

/// The directory of `cgroup_path` under `mount`, or its nearest ancestor up to the mount itself,
/// whose `limit_file` parses to a limit that `accept`s. Unreadable or bad files count as no limit.
fn nearest_limited(
    mount: &Path,
    cgroup_path: &str,
    limit_file: &str,
    accept: impl Fn(Option<u64>) -> bool,
) -> Option<PathBuf> {
    let parts: Vec<&str> = cgroup_path.split('/').filter(|part| !part.is_empty()).collect();
    let depth = parts.len().min(MAX_CGROUP_DEPTH);
    (0..=depth).rev().find_map(|level| {
        let dir = parts[..level].iter().fold(mount.to_path_buf(), |dir, part| dir.join(part));
        let text = std::fs::read_to_string(dir.join(limit_file)).ok()?;
        accept(parse_cgroup_limit("limit", &text).ok()?).then_some(dir)
    })
}

/// What one period does, decided from one reading (pure, see [`plan`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Bytes of fresh memory `MapSlab` and pool fills may take before the next reading.
    pub budget_bytes: u64,
    /// Pooled slabs to free.
    pub release_pooled: usize,
    /// Mapped slabs to evict (E).
    pub evict: usize,
    /// Slabs to add to the pool.
    pub prealloc: usize,
}

/// The slab state a plan starts from.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput {
    pub reading: MemoryReading,
    pub headroom_percent: u8,
    pub slab_size_bytes: u64,
    pub pooled_slabs: usize,
    pub mapped_slabs: usize,
    pub prealloc_target: usize,
}

/// Decides one period. Below the headroom: free the pool first, then evict E = the slabs whose
/// memory brings free memory back to the headroom; lend nothing fresh. Above it: lend what lies
/// above the headroom, and pre-allocate towards the pool target while at least one slab of
/// margin stays above the headroom after the fills (so a fill never causes the next eviction).
pub fn plan(input: PlanInput) -> Plan {
    let slab = input.slab_size_bytes.max(1);
    let headroom_bytes =
        (u128::from(input.reading.limit_bytes) * u128::from(input.headroom_percent) / 100) as u64;
    let free_bytes = input.reading.free_bytes;
    if free_bytes < headroom_bytes {
        let deficit_slabs =
            usize::try_from((headroom_bytes - free_bytes).div_ceil(slab)).unwrap_or(usize::MAX);
        let release_pooled = deficit_slabs.min(input.pooled_slabs);
        let evict = (deficit_slabs - release_pooled).min(input.mapped_slabs);
        return Plan { budget_bytes: 0, release_pooled, evict, prealloc: 0 };
    }
    let spare_bytes = free_bytes - headroom_bytes;
    let affordable = usize::try_from((spare_bytes / slab).saturating_sub(1)).unwrap_or(usize::MAX);
    let prealloc = input.prealloc_target.saturating_sub(input.pooled_slabs).min(affordable);
    Plan { budget_bytes: spare_bytes, release_pooled: 0, evict: 0, prealloc }
}

/// Batch eviction: samples `evict + extra` of `candidates` at random and returns the `evict`
/// least active of the sample (fewest requests last period), least active first.
pub fn choose_victims(
    candidates: &[SlabActivity],
    evict: usize,
    extra: usize,
    rng: &mut impl rand::Rng,
) -> Vec<SlabActivity> {
    choose_victims_asking(candidates, evict, extra, rng, |_| {})
}

/// [`choose_victims`], with `ask` given the sample to correct its activity (ask the owners)
/// before the least active are chosen.
pub fn choose_victims_asking(
    candidates: &[SlabActivity],
    evict: usize,
    extra: usize,
    rng: &mut impl rand::Rng,
    ask: impl FnOnce(&mut [SlabActivity]),
) -> Vec<SlabActivity> {
    let mut sample: Vec<SlabActivity> =
        candidates.choose_multiple(rng, evict.saturating_add(extra)).copied().collect();
    ask(&mut sample);
    sample.sort_by_key(|slab| slab.requests);
    sample.truncate(evict);
    sample
}

/// How long the monitor waits for owners to answer `SlabActivityQuery` (at most a quarter of
/// the period). An owner that does not answer in time is not looking at its sockets, which
/// says something about its activity too; its slabs keep what the node saw.
const OWNER_ANSWER_WAIT: Duration = Duration::from_millis(50);

/// The owners' answers to the monitor's `SlabActivityQuery`s, filled in by connection threads.
/// Bounded: only the monitor registers questions (at most one sample's worth per period) and
/// it removes them all before the period ends.
#[derive(Default)]
pub struct ActivityAnswers {
    next_request_id: AtomicU64,
    pending: Mutex<HashMap<u64, Question>>,
}

struct Question {
    client_id: u64,
    slab_id: u32,
    accesses: Option<u64>,
}

impl ActivityAnswers {
    fn ask(&self, client_id: u64, slab_id: u32) -> u64 {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock().insert(request_id, Question { client_id, slab_id, accesses: None });
        request_id
    }

    /// Records an answer if it is to a question asked of this client about this slab.
    pub fn answer(&self, request_id: u64, client_id: u64, slab_id: u32, accesses: u64) {
        if let Some(question) = self.lock().get_mut(&request_id) {
            if question.client_id == client_id && question.slab_id == slab_id {
                question.accesses = Some(accesses);
            }
        }
    }

    fn answered(&self, request_ids: &[u64]) -> bool {
        let pending = self.lock();
        request_ids.iter().all(|id| pending.get(id).is_none_or(|question| question.accesses.is_some()))
    }

    fn take(&self, request_id: u64) -> Option<u64> {
        self.lock().remove(&request_id).and_then(|question| question.accesses)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Question>> {
        self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Asks the owner of every sampled slab, on every connection it volunteered (one per engine when
/// a client runs several under one identity; an engine that does not hold the slab answers 0),
/// how active the slab is, waits up to [`OWNER_ANSWER_WAIT`], and raises each answered slab's
/// activity to what its owner reports (the highest answer) since its previous answer. The
/// node's own count stays where the owner says less (a TCP slab's requests are seen here
/// anyway); for an exported slab, whose accesses the node cannot see (`u64::MAX` = unknown), the
/// owner's figure replaces it.
fn ask_owners(shared: &Shared, sample: &mut [SlabActivity], wait: Duration) {
    let mut asked: Vec<(usize, u64)> = Vec::with_capacity(sample.len());
    for (index, slab) in sample.iter().enumerate() {
        for peer in shared.peers.activity_peers(slab.owner_client_id) {
            let request_id = shared.activity_answers.ask(slab.owner_client_id, slab.slab_id);
            let mut frame = Vec::with_capacity(remem_proto::HEADER_BYTES + 4);
            Control::SlabActivityQuery { slab_id: slab.slab_id }.encode(request_id, &mut frame);
            if peer.send_frames(&frame) {
                asked.push((index, request_id));
            } else {
                shared.activity_answers.take(request_id);
            }
        }
    }
    if asked.is_empty() {
        return;
    }
    let ids: Vec<u64> = asked.iter().map(|&(_, id)| id).collect();
    let deadline = Instant::now() + wait;
    while !shared.activity_answers.answered(&ids) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut totals: Vec<Option<u64>> = vec![None; sample.len()];
    for (index, request_id) in asked {
        if let Some(total) = shared.activity_answers.take(request_id) {
            totals[index] = Some(totals[index].map_or(total, |other| other.max(total)));
        }
    }
    for (index, total) in totals.into_iter().enumerate() {
        let Some(total) = total else { continue };
        let Ok(slab) = shared.core.table.get_any(sample[index].slab_id) else { continue };
        let reported = slab.owner_accesses_since_last(total);
        let seen = &mut sample[index].requests;
        *seen = if *seen == u64::MAX { reported } else { (*seen).max(reported) };
    }
}

/// A started monitor: its thread, joined by [`Monitor::join`] after the node's stop flag is set.
pub struct Monitor {
    thread: JoinHandle<()>,
}

impl Monitor {
    /// Starts the monitor thread on `shared`, reading `source`.
    ///
    /// Errors: the thread could not be spawned.
    pub fn start(
        shared: Arc<Shared>,
        config: ResourceMonitorConfig,
        source: MemorySource,
    ) -> std::io::Result<Monitor> {
        let thread = std::thread::Builder::new()
            .name("remem-monitor".to_owned())
            .spawn(move || run(&shared, &config, &source))?;
        Ok(Monitor { thread })
    }

    pub fn join(self) {
        if self.thread.join().is_err() {
            tracing::error!("the resource monitor thread panicked");
        }
    }
}

fn run(shared: &Shared, config: &ResourceMonitorConfig, source: &MemorySource) {
    let mut rng = rand::thread_rng();
    let mut read_failing = false;
    let mut below_headroom = false;
    while !shared.stopping.load(Ordering::Relaxed) {
        let started = Instant::now();
        let activity = shared.core.table.take_activity();
        match source.read() {
            Ok(reading) => {
                if read_failing {
                    tracing::info!(%source, "resource monitor: host memory readable again");
                    read_failing = false;
                }
                below_headroom = act(shared, config, reading, &activity, below_headroom, &mut rng);
            }
            Err(error) => {
                // Keep the last budget: one bad reading is no reason to lend or evict more.
                if !read_failing {
                    tracing::warn!(%source, %error, "resource monitor: cannot read host memory");
                    read_failing = true;
                }
            }
        }
        // Sleep out the period in short steps so a stopping node does not wait for it.
        while !shared.stopping.load(Ordering::Relaxed) {
            let Some(left) = config.period.checked_sub(started.elapsed()).filter(|left| !left.is_zero())
            else {
                break;
            };
            std::thread::sleep(left.min(STOP_POLL));
        }
    }
}

/// One period's actions. Returns whether the host is below the headroom.
fn act(
    shared: &Shared,
    config: &ResourceMonitorConfig,
    reading: MemoryReading,
    activity: &[SlabActivity],
    was_below_headroom: bool,
    rng: &mut impl rand::Rng,
) -> bool {
    let stats = shared.core.table.stats();
    let plan = plan(PlanInput {
        reading,
        headroom_percent: config.headroom_percent,
        slab_size_bytes: shared.core.slab_size_bytes,
        pooled_slabs: stats.pooled_slabs as usize,
        mapped_slabs: activity.len(),
        prealloc_target: config.prealloc_slabs as usize,
    });
    shared.core.table.set_host_budget(Some(plan.budget_bytes));
    let headroom_bytes = (u128::from(reading.limit_bytes) * u128::from(config.headroom_percent) / 100) as u64;
    let below_headroom = reading.free_bytes < headroom_bytes;
    if below_headroom {
        let released = shared.core.table.drain_pool(plan.release_pooled).len();
        let wait = OWNER_ANSWER_WAIT.min(config.period / 4);
        let victims =
            choose_victims_asking(activity, plan.evict, config.eviction_extra as usize, rng, |sample| {
                ask_owners(shared, sample, wait)
            });
        let mut evicted = Vec::with_capacity(victims.len());
        for victim in &victims {
            match shared.evict_slab(victim.slab_id, None) {
                Ok(_) => evicted.push((victim.slab_id, victim.requests)),
                Err(error) => {
                    tracing::debug!(slab_id = victim.slab_id, %error, "eviction candidate went away")
                }
            }
        }
        tracing::info!(
            limit_bytes = reading.limit_bytes,
            free_bytes = reading.free_bytes,
            headroom_bytes,
            pooled_released = released,
            slabs_sampled = plan.evict.saturating_add(config.eviction_extra as usize).min(activity.len()),
            ?evicted,
            "resource monitor: host below headroom, mapping refused"
        );
    } else {
        if was_below_headroom {
            tracing::info!(
                limit_bytes = reading.limit_bytes,
                free_bytes = reading.free_bytes,
                headroom_bytes,
                "resource monitor: host back above headroom"
            );
        }
        let mut added = 0;
        for _ in 0..plan.prealloc {
            match shared.core.table.fill_pool_one(config.prealloc_slabs as usize) {
                Ok(true) => added += 1,
                Ok(false) => break,
                Err(error) => {
                    tracing::warn!(%error, "resource monitor: pre-allocation failed");
                    break;
                }
            }
        }
        if added > 0 {
            tracing::info!(
                limit_bytes = reading.limit_bytes,
                free_bytes = reading.free_bytes,
                headroom_bytes,
                added,
                pooled_slabs = shared.core.table.stats().pooled_slabs,
                "resource monitor: slabs pre-allocated"
            );
        }
    }
    below_headroom
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn proc_self_cgroup_of_a_v1_and_v2_host() {
        let text = "9:name=systemd:/\n4:memory:/process_api/abc\n3:cpu,cpuacct:/x\n0::/user.slice/a:b\n";
        let membership = parse_proc_self_cgroup(text);
        assert_eq!(membership.memory_v1_path.as_deref(), Some("/process_api/abc"));
        assert_eq!(membership.unified_path.as_deref(), Some("/user.slice/a:b"));
    }

    #[test]
    fn proc_self_cgroup_ignores_garbage_and_escapes() {
        for text in ["", "garbage", "4:memory", "4:memory:relative", "4:memory:/a/../../etc", "\0\0:\n::"] {
            assert_eq!(parse_proc_self_cgroup(text).memory_v1_path, None, "{text:?}");
        }
        assert_eq!(parse_proc_self_cgroup("0::/\n").unified_path.as_deref(), Some("/"));
    }

    #[test]
    fn cgroup_limits_unlimited_and_garbage() {
        assert_eq!(parse_cgroup_limit("l", "max\n").unwrap(), None);
        assert_eq!(parse_cgroup_limit("l", "9223372036854771712\n").unwrap(), None);
        assert_eq!(parse_cgroup_limit("l", "1073741824\n").unwrap(), Some(1 << 30));
        for bad in ["", "-1", "1.5", "12 kB", "99999999999999999999999", "max max", "0x10"] {
            let error = parse_cgroup_limit("memory.max", bad).unwrap_err();
            assert!(error.to_string().contains("memory.max"), "{error}");
        }
        assert_eq!(parse_cgroup_bytes("u", " 4096 \n").unwrap(), 4096);
        assert!(parse_cgroup_bytes("u", &"7".repeat(10_000)).unwrap_err().to_string().len() < 200);
    }

    #[test]
    fn meminfo_sample_and_hostile_inputs() {
        let sample =
            "MemTotal:       24684084 kB\nMemFree:        23028128 kB\nMemAvailable:   23689172 kB\n";
        assert_eq!(
            parse_meminfo(sample).unwrap(),
            MemInfo { total_bytes: 24684084 * 1024, available_bytes: 23689172 * 1024 }
        );
        assert!(matches!(
            parse_meminfo("MemTotal: 10 kB\n"),
            Err(MemoryReadError::MissingField { field: "MemAvailable" })
        ));
        assert!(matches!(parse_meminfo(""), Err(MemoryReadError::MissingField { field: "MemTotal" })));
        assert!(matches!(
            parse_meminfo("MemTotal: 18446744073709551615 kB\nMemAvailable: 1 kB\n"),
            Err(MemoryReadError::Overflow { .. })
        ));
        assert!(matches!(
            parse_meminfo("MemTotal: lots kB\nMemAvailable: 1 kB\n"),
            Err(MemoryReadError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_meminfo("MemTotal: 1 kB\nMemAvailable: 2 kB\n"),
            Err(MemoryReadError::Inconsistent { .. })
        ));
        // Arbitrary bytes never panic.
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..2000 {
            let length = rand::Rng::gen_range(&mut rng, 0..64);
            let bytes: Vec<u8> = (0..length).map(|_| rand::Rng::gen_range(&mut rng, b'0'..=b'z')).collect();
            let text = format!("MemTotal:{}\nMemAvailable:{}", String::from_utf8_lossy(&bytes), "1 kB");
            let _ = parse_meminfo(&text);
            let _ = parse_cgroup_limit("l", &text);
            let _ = parse_proc_self_cgroup(&text);
        }
    }

    fn input(limit_mib: u64, free_mib: u64, pooled: usize, mapped: usize) -> PlanInput {
        PlanInput {
            reading: MemoryReading { limit_bytes: limit_mib << 20, free_bytes: free_mib << 20 },
            headroom_percent: 25,
            slab_size_bytes: 16 << 20,
            pooled_slabs: pooled,
            mapped_slabs: mapped,
            prealloc_target: 2,
        }
    }

    #[test]
    fn below_headroom_frees_the_pool_first_then_evicts_the_rest() {
        // Headroom 256 MiB, free 200: 56 MiB short = 4 slabs of 16 MiB.
        assert_eq!(
            plan(input(1024, 200, 2, 10)),
            Plan { budget_bytes: 0, release_pooled: 2, evict: 2, prealloc: 0 }
        );
        assert_eq!(
            plan(input(1024, 250, 2, 10)),
            Plan { budget_bytes: 0, release_pooled: 1, evict: 0, prealloc: 0 }
        );
        // Never more evictions than mapped slabs.
        assert_eq!(plan(input(1024, 0, 0, 3)).evict, 3);
    }

    #[test]
    fn above_headroom_lends_the_spare_and_preallocates_with_a_margin() {
        let plan_high = plan(input(1024, 512, 0, 0));
        assert_eq!(plan_high.budget_bytes, 256 << 20);
        assert_eq!(plan_high.prealloc, 2);
        // 40 MiB spare: two slabs fit, but only one leaves a slab of margin.
        assert_eq!(plan(input(1024, 296, 0, 0)).prealloc, 1);
        assert_eq!(plan(input(1024, 270, 0, 0)).prealloc, 0);
        assert_eq!(plan(input(1024, 512, 2, 0)).prealloc, 0);
    }

    #[test]
    fn batch_eviction_takes_the_least_active_of_the_sample() {
        let candidates: Vec<SlabActivity> = (1..=10)
            .map(|slab_id| SlabActivity { slab_id, owner_client_id: 1, requests: u64::from(slab_id) * 100 })
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        // Sampling everything picks the globally least active.
        let victims = choose_victims(&candidates, 3, 20, &mut rng);
        assert_eq!(victims.iter().map(|victim| victim.slab_id).collect::<Vec<_>>(), [1, 2, 3]);
        for _ in 0..100 {
            let victims = choose_victims(&candidates, 2, 2, &mut rng);
            assert_eq!(victims.len(), 2);
            // Of 4 sampled, the 2 evicted are never the 2 most active of all 10.
            assert!(victims.iter().all(|victim| victim.slab_id <= 8));
        }
        assert!(choose_victims(&[], 3, 2, &mut rng).is_empty());
    }
}
