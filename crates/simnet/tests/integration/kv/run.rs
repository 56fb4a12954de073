//! One seeded run of the kv's engine under the simulator: a plan drawn from a seed (scheme,
//! faults within the scheme's tolerance or beyond it, a workload), run with several simulated
//! connections against the model (`model.rs`), every reply checked as it comes.
//!
//! A run: nodes of 16 KiB slabs, the regions `remem kv` makes for the scheme (EC(4,2) first,
//! then none, rep2 and rep3 as the policy needs them, then EOR's main copies beside the EC
//! region), every range mapped lazily by the cache itself; the cache built by
//! `remem_kv::cache::open::cache_over_page_client` over [`SimPageClient`]. Requests are parsed by
//! `remem_memcache::parse` and executed by the one dispatcher (`remem_kv::dispatch`), as the
//! server does; between requests simulated time moves and the engine's completions are settled
//! into replies. Housekeeping runs every simulated second (the hotness policy, ranges given
//! back). Faults come from simnet's seeded `FaultSchedule`s.
//!
//! Checks: every reply is well formed and explained by the model (a value the key may hold; a
//! miss only where the key may be absent, or beyond r, or after evictions; `SERVER_ERROR` on a
//! read only beyond r); the cache's `check_invariants()` after every step; at the end no op in
//! flight, every request answered, and a read of every key as the model says.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remem_client::engine::EngineConfig;
use remem_kv::completion::ConnRef;
use remem_kv::reply::Outbox;
use remem_kv::text::{After, MultiGet};
use remem_kv::{Cache, CacheConfig, Policy, Scheme};
use remem_memcache::{Limits, Parse};
use remem_simnet::{
    FaultAction, NetworkOptions, PlacementPolicy, SimCluster, SimDriver, SimTime, Tolerance, SECOND,
};

use super::adapter::SimPageClient;
use super::model::{parse_reply, Command, KeyModel, Reply};
use super::plan::{scheme_name, tolerance_of, KvFailure, KvPlan, KvReport, EC, NODES};

const SLAB_BYTES: u64 = 16 * 1024;
const CAPACITY_SLABS: u32 = 96;
const REGION_PAGES: u64 = 512;
const PAGE_BYTES: usize = 4096;
/// Keys of values (set, add, replace, append, prepend, cas, and the meta ms, mg, md) and of
/// counters (incr, decr).
const VALUE_KEYS: usize = 6;
const COUNTER_KEYS: usize = 2;
const CONNECTIONS: usize = 3;
/// Ops of one key in flight at most (the model's sets stay small).
const KEY_IN_FLIGHT: usize = 3;
/// Longest a value grows by appends (a few pages).
const MAX_VALUE_BYTES: usize = 4 * PAGE_BYTES;
/// How long the run may take to answer everything after the workload.
const DRAIN_LIMIT: SimTime = 30 * SECOND;
/// How long the cluster may take to rebuild what the plan broke.
const HEAL_LIMIT: SimTime = 60 * SECOND;
const TRACE_LINES: usize = 300;
/// Lines of the harness's own trace kept while a run goes (the driver keeps its 4,000).
const KV_TRACE_LINES: usize = 2_000;

/// A request sent and not answered yet: its places in its connection's reply order.
struct Pending {
    id: u64,
    key: usize,
    command: Command,
    first_seq: u64,
    end_seq: u64,
}

/// A simulated client connection.
struct Connection {
    conn: ConnRef,
    next_seq: u64,
    pending: Vec<Pending>,
    /// Replies made and not sent yet, by place, as the server keeps them
    /// (`server/output.rs`): with the place a reply ends its command through.
    replies: BTreeMap<u64, (Vec<u8>, Option<u64>)>,
    /// The next place to send: replies leave in request order.
    next_to_send: u64,
    /// What was sent, by place (nothing for the places a `SERVER_ERROR` ended early).
    sent: BTreeMap<u64, Vec<u8>>,
    multi_get: Option<MultiGet>,
}

impl Connection {
    /// Sends every reply that is next in order, as the server's output does.
    fn send_in_order(&mut self) {
        while let Some((bytes, ends_through)) = self.replies.remove(&self.next_to_send) {
            self.sent.insert(self.next_to_send, bytes);
            self.next_to_send += 1;
            if let Some(through) = ends_through {
                self.replies = self.replies.split_off(&(through + 1));
                while self.next_to_send <= through {
                    self.sent.insert(self.next_to_send, Vec::new());
                    self.next_to_send += 1;
                }
            }
        }
    }
}

/// Runs `plan`; `Err` carries the failure with the trace.
pub fn run_plan(plan: &KvPlan) -> Result<KvReport, Box<KvFailure>> {
    run_plan_keeping(plan, TRACE_LINES)
}

/// [`run_plan`], a failure keeping the last `lines` of the trace (the driver's and the
/// harness's, in time order).
pub fn run_plan_keeping(plan: &KvPlan, lines: usize) -> Result<KvReport, Box<KvFailure>> {
    let mut run =
        KvRun::new(plan).map_err(|message| KvFailure { plan: plan.clone(), message, trace: Vec::new() })?;
    match run.execute() {
        Ok(()) => Ok(run.report()),
        Err(message) => {
            let mut trace = run.cache.client().driver().trace();
            trace.extend(run.trace.iter().cloned());
            // Both kinds of line start with the time in ms: a stable sort interleaves them.
            let time = |line: &String| line.split_whitespace().next().and_then(|at| at.parse::<f64>().ok());
            trace.sort_by(|a, b| time(a).partial_cmp(&time(b)).unwrap_or(std::cmp::Ordering::Equal));
            let keep = trace.len().saturating_sub(lines);
            Err(Box::new(KvFailure { plan: plan.clone(), message, trace: trace.split_off(keep) }))
        }
    }
}

/// The state of one run.
pub struct KvRun {
    plan: KvPlan,
    cache: Cache<SimPageClient>,
    outbox: Outbox,
    connections: Vec<Connection>,
    keys: Vec<KeyModel>,
    rng: StdRng,
    next_id: u64,
    next_housekeeping: SimTime,
    generation: u64,
    evictions_seen: u64,
    report: KvReport,
    trace: Vec<String>,
}

/// The cache's settings in every run: a memory limit far above what the keys hold (nothing
/// is evicted for memory), and for `auto` a hotness policy fast enough for a run of seconds.
fn cache_config(scheme: Option<Scheme>) -> CacheConfig {
    let mut policy = Policy { fixed: scheme, ..Policy::default() };
    if scheme.is_none() {
        policy.cold_after = std::time::Duration::from_secs(1);
        policy.hot_reads = 2;
        policy.hot_window = std::time::Duration::from_secs(1);
    }
    CacheConfig {
        memory_limit_bytes: 64 << 20,
        max_item_bytes: 1 << 20,
        policy,
        ec: EC,
        bypass: true,
        max_background_transitions: 8,
    }
}

fn engine_config(seed: u64) -> EngineConfig {
    let mut config = EngineConfig::new(0x6B76_0000_0000 | (seed & 0xffff_ffff), PAGE_BYTES);
    config.max_in_flight = 32;
    config.request_timeout = std::time::Duration::from_millis(10);
    config.heartbeat_interval = std::time::Duration::from_millis(20);
    config.probe_interval = std::time::Duration::from_millis(20);
    config
}

/// The regions `remem kv` makes for `config`'s policy, lazily mapped, in its order.
fn create_regions(driver: &mut SimDriver, config: &CacheConfig) -> Result<(), String> {
    let needed = remem_kv::schemes_needed(&config.policy);
    let ec = driver.create_lazy_region(remem_kv::region_shape(Scheme::Ec, config.ec), REGION_PAGES)?;
    for scheme in [Scheme::None, Scheme::Rep2, Scheme::Rep3] {
        if needed.contains(&scheme) {
            driver.create_lazy_region(remem_kv::region_shape(scheme, config.ec), REGION_PAGES)?;
        }
    }
    if needed.contains(&Scheme::Eor) {
        let shape = remem_kv::region_shape(Scheme::None, config.ec);
        driver.create_lazy_region_beside(shape, ec.page_count, &ec, config.ec.data_splits)?;
    }
    Ok(())
}

impl KvRun {
    pub fn new(plan: &KvPlan) -> Result<KvRun, String> {
        let mut cluster = SimCluster::new(plan.seed, NetworkOptions::default());
        for node in 0..NODES {
            cluster.add_node(format!("d{node}"), CAPACITY_SLABS, SLAB_BYTES);
        }
        let mut driver = SimDriver::new(
            cluster,
            engine_config(plan.seed),
            PlacementPolicy::LeastLoaded,
            plan.seed ^ 0x5EED,
        );
        driver.enable_trace();
        let config = cache_config(plan.scheme);
        create_regions(&mut driver, &config).map_err(|error| format!("setup: {error}"))?;
        let regions: Vec<_> = driver.engine().regions().collect();
        let start = driver.now();
        let faults: Vec<_> = plan
            .schedule
            .faults
            .iter()
            .map(|fault| remem_simnet::ScheduledFault { at: start + fault.at, ..*fault })
            .collect();
        driver.schedule_faults(&faults);
        let mut cache =
            remem_kv::cache::open::cache_over_page_client(SimPageClient::new(driver), &regions, config)
                .map_err(|error| format!("setup: {error}"))?;
        let connections = (0..CONNECTIONS)
            .map(|index| Connection {
                conn: open(&mut cache, index),
                next_seq: 0,
                pending: Vec::new(),
                replies: BTreeMap::new(),
                next_to_send: 0,
                sent: BTreeMap::new(),
                multi_get: None,
            })
            .collect();
        Ok(KvRun {
            plan: plan.clone(),
            cache,
            outbox: Outbox::default(),
            connections,
            keys: vec![KeyModel::default(); VALUE_KEYS + COUNTER_KEYS],
            rng: StdRng::seed_from_u64(plan.seed ^ 0x6B76_0000_0000_0002),
            next_id: 1,
            next_housekeeping: start + SECOND,
            generation: 0,
            evictions_seen: 0,
            report: KvReport::default(),
            trace: Vec::new(),
        })
    }

    fn now(&self) -> SimTime {
        self.cache.client().driver().now()
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if self.trace.len() == 2 * KV_TRACE_LINES {
            self.trace.drain(..KV_TRACE_LINES);
        }
        let at = self.now() as f64 / 1e6;
        self.trace.push(format!("{at:>10.3} ms  kv: {}", line()));
    }

    fn execute(&mut self) -> Result<(), String> {
        let mut time = self.now();
        for _ in 0..self.plan.ops {
            time += self.rng.gen_range(0..=self.plan.op_gap_max);
            self.advance(time)?;
            self.send_random_request()?;
        }
        let last_fault = self.plan.schedule.faults.last().map_or(0, |fault| fault.at);
        self.drain()?;
        let until = self.now().max(last_fault);
        self.advance(until)?;
        self.drain()?;
        self.read_every_key()?;
        self.kill_at_once()?;
        self.read_every_key()?;
        // Beyond r a lost value answers SERVER_ERROR once and then misses: read again.
        self.read_every_key()
    }

    fn read_every_key(&mut self) -> Result<(), String> {
        for key in 0..self.keys.len() {
            self.send(key % CONNECTIONS, key, Command::Get)?;
        }
        self.drain()
    }

    /// After the plan: nodes killed at the same time, none of which the plan touched. Within
    /// tolerance, once every range is whole again, r of them (every value must still read back
    /// exactly), for the schemes whose every copy is rebuilt (rep2, rep3, EC: an EOR main copy
    /// lives in a region without redundancy, so a second failure after the first is beyond what
    /// EOR claims); beyond it, r + 1 (values may be lost, never wrong).
    fn kill_at_once(&mut self) -> Result<(), String> {
        let r = tolerance_of(self.plan.scheme);
        // A node whose bits were flipped or whose writes were dropped still counts against r:
        // its stale or corrupt splits are erasures until their pages are written again.
        let lasting = self
            .plan
            .schedule
            .faults
            .iter()
            .filter(|fault| {
                matches!(fault.action, FaultAction::FlipBits { .. } | FaultAction::DropNextWrites { .. })
            })
            .count();
        let count = match (self.plan.tolerance, self.plan.scheme) {
            (Tolerance::Beyond, _) => r + 1,
            (Tolerance::Within, Some(Scheme::Rep2 | Scheme::Rep3 | Scheme::Ec)) => r.saturating_sub(lasting),
            (Tolerance::Within, _) => 0,
        };
        if count == 0 {
            return Ok(());
        }
        if self.plan.tolerance == Tolerance::Within {
            // Every scheduled fault applied and every stall and partition over first: a node
            // stalled or cut off that the engine has not noticed yet looks healed, and killing
            // r others beside it would put r + 1 out at once.
            let quiet_at = self
                .plan
                .schedule
                .faults
                .iter()
                .map(|fault| match fault.action {
                    FaultAction::Stall { until } | FaultAction::Partition { until, .. } => {
                        until.max(fault.at)
                    }
                    _ => fault.at,
                })
                .max()
                .unwrap_or(0);
            if quiet_at > self.now() {
                self.advance(quiet_at)?;
            }
            let limit = self.now() + HEAL_LIMIT;
            while !self.cache.client().driver().is_healed() {
                if self.now() >= limit {
                    return Err(format!("the cluster did not heal in {HEAL_LIMIT} ns"));
                }
                let next = self.cache.client().driver().next_event_time().unwrap_or(limit).min(limit);
                self.advance(next.max(self.now() + 1))?;
            }
        }
        let untouched: Vec<usize> =
            (0..NODES).filter(|node| !self.plan.schedule.faulty_nodes.contains(node)).collect();
        let first = self.rng.gen_range(0..untouched.len());
        let victims: Vec<usize> =
            (0..count).map(|offset| untouched[(first + offset) % untouched.len()]).collect();
        self.note(|| format!("kills nodes {victims:?} at once"));
        for &node in &victims {
            self.cache.client_mut().driver_mut().fault_now(node, FaultAction::Kill);
        }
        Ok(())
    }

    /// Runs everything that happens up to `until`, the cache settled after each step.
    fn advance(&mut self, until: SimTime) -> Result<(), String> {
        loop {
            let more = self.cache.client_mut().driver_mut().step(until);
            self.cache.on_io(true);
            if self.now() >= self.next_housekeeping {
                self.next_housekeeping += SECOND;
                let now_unix = self.cache.now_unix();
                self.cache.housekeeping(now_unix);
            }
            self.settle()?;
            if !more {
                return Ok(());
            }
        }
    }

    /// After any call into the cache: start waiting ops, answer what finished, check.
    fn settle(&mut self) -> Result<(), String> {
        self.cache.kick();
        for index in 0..self.connections.len() {
            if let Some(mut get) = self.connections[index].multi_get.take() {
                let conn = self.connections[index].conn;
                if !remem_kv::text::continue_get(&mut self.cache, &mut self.outbox, conn, &mut get) {
                    self.connections[index].multi_get = Some(get);
                }
            }
        }
        remem_kv::dispatch::settle(&mut self.cache, &mut self.outbox);
        self.cache.check_invariants();
        self.note_evictions()?;
        self.deliver()
    }

    /// Evictions are allowed (a region that cannot grow evicts): a key the index no longer
    /// holds after one may be absent.
    fn note_evictions(&mut self) -> Result<(), String> {
        let evictions = self.cache.stats().evictions;
        if evictions == self.evictions_seen {
            return Ok(());
        }
        self.evictions_seen = evictions;
        for key in 0..self.keys.len() {
            if self.cache.index().find(key_name(key).as_bytes()).is_none() {
                self.note(|| format!("{} evicted (or absent) after an eviction", key_name(key)));
                self.keys[key].evicted(self.next_id)?;
            }
        }
        Ok(())
    }

    /// Waits until every request is answered and nothing is in flight.
    fn drain(&mut self) -> Result<(), String> {
        let limit = self.now() + DRAIN_LIMIT;
        while !self.idle() {
            if self.now() >= limit {
                let waiting: usize = self.connections.iter().map(|connection| connection.pending.len()).sum();
                return Err(format!(
                    "not idle after {DRAIN_LIMIT} ns: {waiting} requests unanswered, {} page ops busy, {} waiting, {} in the driver",
                    self.cache.io().busy(),
                    self.cache.io().waiting(),
                    self.cache.client().ops_in_driver()
                ));
            }
            let next = self.cache.client().driver().next_event_time().unwrap_or(limit).min(limit);
            self.advance(next.max(self.now() + 1))?;
        }
        Ok(())
    }

    fn idle(&self) -> bool {
        self.connections
            .iter()
            .all(|connection| connection.pending.is_empty() && connection.multi_get.is_none())
            && self.cache.io().busy() == 0
            && self.cache.io().waiting() == 0
            && self.cache.client().driver().in_flight() == 0
    }

    fn report(&self) -> KvReport {
        let mut report = self.report.clone();
        let stats = self.cache.stats();
        report.evictions = stats.evictions;
        report.transitions = stats.transitions;
        report.remote_read_bytes = stats.bytes_read_remote;
        report.degraded_reads = stats.degraded_reads;
        report.lost_reads = stats.lost_reads;
        (report.ranges_mapped, report.ranges_released) = self.cache.range_changes();
        report.faults = self.cache.client().driver().fault_tally();
        report.simulated_ns = self.now();
        report
    }

    // ---- the workload -----------------------------------------------------------------------

    fn send_random_request(&mut self) -> Result<(), String> {
        let connection = self.rng.gen_range(0..CONNECTIONS);
        if self.connections[connection].multi_get.is_some() {
            return Ok(());
        }
        let key = self.rng.gen_range(0..self.keys.len());
        if self.keys[key].in_flight() >= KEY_IN_FLIGHT {
            return Ok(());
        }
        let command = if key < VALUE_KEYS { self.value_command(key) } else { self.counter_command() };
        self.send(connection, key, command)
    }

    fn value_command(&mut self, key: usize) -> Command {
        let flags = self.rng.gen_range(0..4);
        let longest =
            self.keys[key].may_hold().iter().flatten().map(|(_, value)| value.len()).max().unwrap_or(0);
        match self.rng.gen_range(0..100) {
            0..=24 => Command::Set { flags, data: self.value(key) },
            25..=29 => Command::Add { flags, data: self.value(key) },
            30..=34 => Command::Replace { flags, data: self.value(key) },
            35..=44 => {
                let data = self.value(key);
                if longest + data.len() > MAX_VALUE_BYTES {
                    return Command::Set { flags, data };
                }
                if self.rng.gen_bool(0.5) {
                    Command::Append { data }
                } else {
                    Command::Prepend { data }
                }
            }
            45..=49 => {
                Command::Cas { flags, data: self.value(key), unique: self.rng.gen_range(1..self.next_id + 2) }
            }
            50..=52 => Command::Delete,
            53..=54 => Command::MetaDelete,
            55..=59 => Command::Touch,
            60..=74 => Command::Get,
            75..=79 => Command::MetaGet,
            80..=84 => Command::MetaSet { flags, data: self.value(key) },
            _ => Command::Gets,
        }
    }

    fn counter_command(&mut self) -> Command {
        match self.rng.gen_range(0..100) {
            0..=14 => {
                Command::Set { flags: 0, data: self.rng.gen_range(0..1000u64).to_string().into_bytes() }
            }
            15..=39 => Command::Incr { delta: self.rng.gen_range(0..100) },
            40..=54 => Command::Decr { delta: self.rng.gen_range(0..100) },
            55..=59 => Command::Delete,
            60..=64 => Command::Touch,
            _ => Command::Get,
        }
    }

    /// A new value of `key`: a few bytes to a few pages, naming the key and a generation.
    fn value(&mut self, key: usize) -> Vec<u8> {
        self.generation += 1;
        let length = match self.rng.gen_range(0..100) {
            0..=59 => self.rng.gen_range(1..200),
            60..=84 => self.rng.gen_range(200..PAGE_BYTES),
            _ => self.rng.gen_range(PAGE_BYTES..3 * PAGE_BYTES + 100),
        };
        let mut value = format!("<k{key}g{}>", self.generation).into_bytes();
        let mut state = self.generation.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        while value.len() < length {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            value.push(b'a' + (state % 26) as u8);
        }
        value.truncate(length);
        value
    }

    /// Sends `command` on `key` over connection `connection`: parsed and executed as the
    /// server would, the model told of its arrival first.
    fn send(&mut self, connection: usize, key: usize, command: Command) -> Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        let name = key_name(key);
        let bytes = command.request(&name);
        self.note(|| format!("conn {connection} #{id} {}", summary(&bytes)));
        self.keys[key].arrive(id, command.clone());
        self.report.requests += 1;
        let request = match remem_memcache::parse(&bytes, &Limits::default()) {
            Parse::Request { request, consumed } if consumed == bytes.len() => request,
            other => return Err(format!("the harness sent a request the parser refuses: {other:?}")),
        };
        let state = &mut self.connections[connection];
        let first_seq = state.next_seq;
        let after = remem_kv::dispatch::execute(
            &mut self.cache,
            &mut self.outbox,
            state.conn,
            &mut state.next_seq,
            request,
        );
        let end_seq = state.next_seq;
        match after {
            After::Continue => {}
            After::Get(get) => state.multi_get = Some(get),
            After::Close => {
                return Err(format!("the cache closed connection {connection} after {command:?}"))
            }
        }
        state.pending.push(Pending { id, key, command, first_seq, end_seq });
        self.settle()
    }

    /// Takes the replies the cache made, and checks every request whose reply is whole.
    fn deliver(&mut self) -> Result<(), String> {
        for out in self.outbox.take() {
            let connection = self
                .connections
                .iter_mut()
                .find(|connection| connection.conn == out.conn)
                .ok_or_else(|| format!("a reply to a connection that does not exist: {:?}", out.conn))?;
            self.cache.budget_mut().release(out.conn, out.reserved);
            // A place an earlier reply ended its command through sends nothing.
            if out.seq >= connection.next_to_send
                && connection.replies.insert(out.seq, (out.bytes, out.ends_through)).is_some()
            {
                return Err(format!("two replies in place {} of connection {}", out.seq, out.conn.index));
            }
            connection.send_in_order();
        }
        for index in 0..self.connections.len() {
            while let Some(done) = self.take_answered(index) {
                self.check(index, done.0, done.1)?;
            }
        }
        Ok(())
    }

    /// The oldest request of connection `index` if all its reply was sent, with its bytes.
    fn take_answered(&mut self, index: usize) -> Option<(Pending, Vec<u8>)> {
        let connection = &mut self.connections[index];
        if connection.pending.first()?.end_seq > connection.next_to_send {
            return None;
        }
        let pending = connection.pending.remove(0);
        let mut bytes = Vec::new();
        for seq in pending.first_seq..pending.end_seq {
            bytes.extend(connection.sent.remove(&seq).expect("every place before the next to send was sent"));
        }
        Some((pending, bytes))
    }

    fn check(&mut self, connection: usize, pending: Pending, bytes: Vec<u8>) -> Result<(), String> {
        let name = key_name(pending.key);
        self.note(|| format!("conn {connection} #{} {name} answered {}", pending.id, summary(&bytes)));
        let reply = parse_reply(&pending.command, &name, &bytes).map_err(|why| {
            format!(
                "malformed reply to #{} {:?} of {name}: {why}: {}",
                pending.id,
                pending.command,
                summary(&bytes)
            )
        })?;
        let beyond = self.plan.tolerance == Tolerance::Beyond;
        match &reply {
            Reply::ServerError(message) if pending.command.is_read() => {
                self.report.read_errors += 1;
                if !beyond {
                    return Err(format!(
                        "#{} {name}: SERVER_ERROR {message} within the scheme's tolerance",
                        pending.id
                    ));
                }
            }
            Reply::ServerError(message) => {
                self.report.store_errors += 1;
                let cause: String = message.chars().take_while(|c| *c != ':').take(60).collect();
                let kind = format!("{}: {cause}", scheme_name(self.plan.scheme));
                *self.report.store_error_kinds.entry(kind).or_default() += 1;
            }
            Reply::Value { item: None, .. } => self.report.misses += 1,
            Reply::Value { .. } => self.report.values_read += 1,
            _ => {}
        }
        self.keys[pending.key]
            .answer(pending.id, reply, beyond, self.next_id)
            .map_err(|why| format!("#{} on key {name} (conn {connection}): {why}", pending.id))
    }
}

/// Connection `index` opened (its output budget, as the server's accept does).
fn open(cache: &mut Cache<SimPageClient>, index: usize) -> ConnRef {
    let conn = ConnRef { index, generation: 1 };
    cache.budget_mut().open(conn);
    conn
}

fn key_name(key: usize) -> String {
    if key < VALUE_KEYS {
        format!("value:{key}")
    } else {
        format!("counter:{}", key - VALUE_KEYS)
    }
}

/// The first line of a request or reply and its length, for the trace.
fn summary(bytes: &[u8]) -> String {
    let line = bytes.split(|byte| *byte == b'\r').next().unwrap_or(&[]);
    format!("{:?} ({} bytes)", String::from_utf8_lossy(&line[..line.len().min(60)]), bytes.len())
}
