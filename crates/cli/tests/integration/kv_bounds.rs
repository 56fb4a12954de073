//! `remem kv`'s bounds from outside (docs/KV.md "Bounds"): what the server holds for replies is
//! counted against `--output-budget`, so one hostile multi-get and clients that never read
//! cannot grow it while others are served; and its `--unix` socket is owner-only from the moment
//! it exists. Real node processes and a real `remem kv`, stopped by PID when the guards drop;
//! every socket read has a timeout.

use crate::kv_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kv_support::{good_client_progresses, GoodClient, Target, MEMORY_LIMIT};
use remem::kv_bench::{StoreOutcome, TextClient};

/// The budget of these tests: low, so that the values asked for are many times it.
const OUTPUT_BUDGET: &str = "32MiB";
const OUTPUT_BUDGET_BYTES: u64 = 32 << 20;
const LARGE_VALUE_BYTES: usize = 900 << 10;
/// Resident memory the server may take beyond its idle size and its held bytes: the page-op
/// buffers (4 KiB per op: 256 in flight and up to 1024 waiting for a streaming get, or 8192 for
/// pipelined requests), the value being rendered beside its reply, and the allocator's slack.
const RSS_ALLOWANCE_BYTES: u64 = 40 << 20;

/// The documented bound on held bytes: the budget, plus one item per connection that held
/// nothing when it started it (docs/KV.md "Bounds"), with its `VALUE` line.
fn held_bound_bytes(connections: u64) -> u64 {
    OUTPUT_BUDGET_BYTES + connections * (LARGE_VALUE_BYTES as u64 + 512)
}

/// The server's resident memory, sampled while a scenario runs.
struct RssSampler {
    pid: u32,
    idle_bytes: u64,
    peak_bytes: AtomicU64,
}

impl RssSampler {
    fn new(target: &Target) -> RssSampler {
        let idle_bytes = target.server.resident_bytes().expect("the server's /proc status");
        RssSampler { pid: target.server.pid(), idle_bytes, peak_bytes: AtomicU64::new(idle_bytes) }
    }

    fn sample(&self) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|number| number.parse::<u64>().ok())
            .unwrap_or(0);
        self.peak_bytes.fetch_max(kib * 1024, Ordering::Relaxed);
    }

    /// Samples every 20 ms until `stop`.
    fn run(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.sample();
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn peak(&self) -> u64 {
        self.peak_bytes.load(Ordering::Relaxed)
    }

    /// Panics unless the peak stayed within the idle size, `held` and the allowance.
    fn assert_within(&self, held: u64, what: &str) {
        let bound = self.idle_bytes + held + RSS_ALLOWANCE_BYTES;
        println!(
            "{what}: resident {} MiB idle, peak {} MiB; bound {} MiB (idle + {} MiB held at most + {} MiB \
             allowance)",
            self.idle_bytes >> 20,
            self.peak() >> 20,
            bound >> 20,
            held >> 20,
            RSS_ALLOWANCE_BYTES >> 20
        );
        assert!(self.peak() <= bound, "{what}: the server's resident memory reached {} B", self.peak());
    }
}

/// With more than one thread, replies went through the reply writers (`remem kv --threads`).
fn writers_wrote_if_threaded(client: &mut TextClient, threads: &str) {
    assert_eq!(stat_number(client, "threads").to_string(), threads);
    let by_writers = stat_number(client, "remem_writer_bytes_written");
    println!("reply writers wrote {by_writers} B");
    assert_eq!(by_writers > 0, threads != "1", "writers wrote {by_writers} B with --threads {threads}");
}

/// Stats of the server as numbers (0 for one that is absent).
fn stat_number(client: &mut TextClient, name: &str) -> u64 {
    let stats = client.stats().expect("stats");
    stats.get(name).and_then(|value| value.parse().ok()).unwrap_or(0)
}

/// A client that reads its answers at a bounded rate, sampling the server's memory as it goes.
/// No byte is trusted: every line and length is checked before use.
struct SlowReader<'a> {
    stream: TcpStream,
    buffer: Vec<u8>,
    chunk: Vec<u8>,
    bytes_per_second: u64,
    started: Instant,
    total_bytes: u64,
    sampler: &'a RssSampler,
}

impl SlowReader<'_> {
    /// Reads until `buffer` holds `want` bytes, no faster than the rate.
    fn fill(&mut self, want: usize) -> Result<(), String> {
        while self.buffer.len() < want {
            let count = self
                .stream
                .read(&mut self.chunk)
                .map_err(|error| format!("after {} B: {error}", self.total_bytes))?;
            if count == 0 {
                return Err(format!("the server closed after {} B", self.total_bytes));
            }
            self.buffer.extend_from_slice(&self.chunk[..count]);
            self.total_bytes += count as u64;
            self.sampler.sample();
            let due = Duration::from_secs_f64(self.total_bytes as f64 / self.bytes_per_second as f64);
            std::thread::sleep(due.saturating_sub(self.started.elapsed()));
        }
        Ok(())
    }

    fn line(&mut self) -> Result<String, String> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|pair| pair == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buffer[..end]).into_owned();
                self.buffer.drain(..end + 2);
                return Ok(line);
            }
            if self.buffer.len() > 1024 {
                let start = String::from_utf8_lossy(&self.buffer[..80]).into_owned();
                return Err(format!("a line longer than 1 KiB: {start:?}"));
            }
            self.fill(self.buffer.len() + 1)?;
        }
    }

    /// Reads a text get's answer: exactly these values, in this order, then `END`.
    fn expect_values(&mut self, expected: &[(&str, &[u8])]) -> Result<(), String> {
        for (index, (key, value)) in expected.iter().enumerate() {
            let line = self.line()?;
            let header = format!("VALUE {key} 0 {}", value.len());
            if line != header {
                return Err(format!("value {index}: {line:?} instead of {header:?}"));
            }
            self.fill(value.len() + 2)?;
            if &self.buffer[..value.len()] != *value || &self.buffer[value.len()..value.len() + 2] != b"\r\n"
            {
                return Err(format!("value {index} ({key}): other bytes than were stored"));
            }
            self.buffer.drain(..value.len() + 2);
        }
        match self.line()? {
            line if line == "END" => Ok(()),
            line => Err(format!("{line:?} instead of END")),
        }
    }
}

#[test]
fn one_get_of_3000_keys_and_300_large_values_streams_within_the_output_budget() {
    one_get_of_3000_keys_streams_within_the_output_budget("budget-multiget", "1");
}

/// The same through a reply writer: the paused get resumes only on the writer's reports.
#[test]
fn one_get_of_3000_keys_streams_within_the_output_budget_with_two_threads() {
    one_get_of_3000_keys_streams_within_the_output_budget("budget-multiget-threads", "2");
}

fn one_get_of_3000_keys_streams_within_the_output_budget(name: &str, threads: &str) {
    let mut target = Target::remem_kv(
        name,
        "none",
        "128MiB",
        &["--output-budget", OUTPUT_BUDGET, "--max-connections", "8", "--threads", threads],
    );
    // 100 values of 900 KiB, each asked three times among 2700 misses: 3000 keys, 263 MiB of
    // answer, eight times the budget.
    let values: Vec<Vec<u8>> =
        (0..100u64).map(|index| remem::kv_bench::value_for(index, 41, LARGE_VALUE_BYTES)).collect();
    let mut client = target.client();
    for (index, value) in values.iter().enumerate() {
        assert_eq!(client.set(&format!("large-{index}"), value).expect("set"), StoreOutcome::Stored);
    }
    let keys: Vec<String> = (0..3000)
        .map(|position| match position % 10 {
            0 => format!("large-{}", position / 10 * 37 % 100),
            _ => format!("missing-{position}"),
        })
        .collect();
    let expected: Vec<(&str, &[u8])> = keys
        .iter()
        .filter_map(|key| {
            let index: usize = key.strip_prefix("large-")?.parse().expect("a number");
            Some((key.as_str(), values[index].as_slice()))
        })
        .collect();
    assert_eq!(expected.len(), 300);

    let sampler = RssSampler::new(&target);
    let mut stream = TcpStream::connect(target.server.address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.set_write_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(format!("get {}\r\n", keys.join(" ")).as_bytes()).expect("send the get");
    let started = Instant::now();
    let mut reader = SlowReader {
        stream,
        buffer: Vec::new(),
        chunk: vec![0; 256 << 10],
        bytes_per_second: 24 << 20,
        started,
        total_bytes: 0,
        sampler: &sampler,
    };
    let answer = reader.expect_values(&expected);
    let elapsed = started.elapsed();
    assert!(answer.is_ok(), "the answer of the get: {answer:?}\nlog:\n{}", target.server.log());
    println!("one get of 3000 keys: {} MiB read byte-exact in {elapsed:.1?}", reader.total_bytes >> 20);
    // The connection serves on after it.
    reader.stream.write_all(b"get large-0\r\n").expect("send");
    reader.expect_values(&[("large-0", &values[0])]).expect("the next get on the connection");

    let peak_held = stat_number(&mut client, "remem_output_held_bytes_peak");
    println!("held at most {} MiB of the budget's {}", peak_held >> 20, OUTPUT_BUDGET);
    assert!(peak_held <= held_bound_bytes(2), "held {peak_held} B for replies");
    sampler.assert_within(held_bound_bytes(2), "one get of 300 values of 900 KiB");
    assert_eq!(stat_number(&mut client, "remem_output_held_bytes"), 0, "every held byte was counted back");
    writers_wrote_if_threaded(&mut client, threads);
    target.assert_running();
}

#[test]
fn ten_connections_that_never_read_stay_within_the_output_budget_while_another_is_served() {
    ten_stalled_connections_stay_within_the_output_budget("budget-stalled", "1");
}

/// The same with the replies in two reply writers, whose sockets fill up.
#[test]
fn ten_connections_that_never_read_stay_within_the_output_budget_with_three_threads() {
    ten_stalled_connections_stay_within_the_output_budget("budget-stalled-threads", "3");
}

fn ten_stalled_connections_stay_within_the_output_budget(name: &str, threads: &str) {
    let mut target =
        Target::remem_kv(name, "none", "40MiB", &["--output-budget", OUTPUT_BUDGET, "--threads", threads]);
    let mut client = target.client();
    let keys: Vec<String> = (0..20).map(|index| format!("large-{index}")).collect();
    for (index, key) in keys.iter().enumerate() {
        let value = remem::kv_bench::value_for(index as u64, 43, LARGE_VALUE_BYTES);
        assert_eq!(client.set(key, &value).expect("set"), StoreOutcome::Stored);
    }
    let sampler = RssSampler::new(&target);
    let good =
        GoodClient { ops: AtomicU64::new(0), failures: Default::default(), slowest_us: AtomicU64::new(0) };
    let stop = AtomicBool::new(false);
    let address = target.server.address;
    let request = format!("get {}\r\n", keys.join(" ")).into_bytes();
    let mut sent_bytes = 0u64;
    std::thread::scope(|scope| {
        let good_thread = scope.spawn(|| good.run(address, &stop));
        let sampler_thread = scope.spawn(|| sampler.run(&stop));
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop_guard = StopOnDrop(&stop);
        good_client_progresses(&good, 0, 10, "before the stalled connections");
        // Each pipelines gets of 20 values of 900 KiB for 5 s and reads nothing.
        let mut stalled: Vec<TcpStream> = (0..10)
            .map(|_| {
                let stream = TcpStream::connect(address).expect("connect");
                stream.set_nonblocking(true).expect("nonblocking");
                stream
            })
            .collect();
        let pipelining = Instant::now();
        while pipelining.elapsed() < Duration::from_secs(5) {
            for stream in &mut stalled {
                // Whole requests or parts of them: the server takes what its budget lets it.
                if let Ok(count) = stream.write(&request) {
                    sent_bytes += count as u64;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let before = good.ops();
        good_client_progresses(&good, before, 10, "while ten connections hold their answers unread");
        let mut fresh = target.client();
        assert_eq!(
            fresh.get("large-3").expect("a get on a new connection").map(|value| value.len()),
            Some(LARGE_VALUE_BYTES)
        );
        let held = stat_number(&mut fresh, "remem_output_held_bytes");
        println!(
            "ten stalled connections sent {} KiB of gets (the server stops reading them); it holds {} MiB \
             for them",
            sent_bytes >> 10,
            held >> 20
        );
        assert!(held <= held_bound_bytes(12), "held {held} B for replies");
        drop(stalled);
        // Their answers go with them, counted back to nothing.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let held = stat_number(&mut fresh, "remem_output_held_bytes");
            if held == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "{held} B still held after the stalled connections closed");
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
        good_thread.join().expect("good client thread");
        sampler_thread.join().expect("sampler thread");
    });
    let failures = good.failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "the good client failed: {failures:?}");
    let slowest = Duration::from_micros(good.slowest_us.load(Ordering::Relaxed));
    println!("the good client did {} set+get rounds, slowest {slowest:?}", good.ops());
    assert!(slowest < Duration::from_secs(5), "a round trip of the good client took {slowest:?}");
    let peak_held = stat_number(&mut client, "remem_output_held_bytes_peak");
    assert!(peak_held <= held_bound_bytes(12), "held {peak_held} B for replies at the peak");
    sampler.assert_within(held_bound_bytes(12), "ten connections that never read");
    writers_wrote_if_threaded(&mut client, threads);
    target.assert_running();
}

// ---------------------------------------------------------------------------------------------
// Access control: the Unix socket.

/// `remem kv --unix` started under umask 000: its socket is 0600 from the moment it exists (a
/// thread stats the path from before the server starts until it listens), the server really ran
/// under umask 000, and the `nobody` user cannot connect, though it can once the socket is made
/// 0666 by hand (so the refusal is the socket's mode, not the directory's).
#[test]
fn unix_socket_is_0600_from_its_creation_under_umask_000_and_nobody_cannot_connect() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    kv_support::require_program("setpriv", "util-linux");
    kv_support::require_program("python3", "python3");
    let name = "unix-umask";
    // Where `Target` puts the test's directory (kv_support::test_dir).
    let dir = std::env::temp_dir().join(format!("remem-kv-{name}-{}", std::process::id()));
    let socket = dir.join("kv.sock");
    let socket_arg = socket.to_str().expect("UTF-8 path").to_owned();
    let stop = AtomicBool::new(false);
    let (mut target, modes_seen) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut modes = std::collections::BTreeMap::<u32, u64>::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(metadata) = std::fs::symlink_metadata(&socket) {
                    if metadata.file_type().is_socket() {
                        *modes.entry(metadata.permissions().mode() & 0o7777).or_default() += 1;
                    }
                }
                std::thread::sleep(Duration::from_micros(20));
            }
            modes
        });
        let target =
            Target::remem_kv_under_umask(name, "rep2", MEMORY_LIMIT, &["--unix", &socket_arg], Some(0o000));
        let mode_at_listening =
            std::fs::symlink_metadata(&socket).expect("the socket exists").permissions().mode();
        stop.store(true, Ordering::Relaxed);
        let mut modes = watcher.join().expect("watcher thread");
        *modes.entry(mode_at_listening & 0o7777).or_default() += 1;
        (target, modes)
    });
    let modes_text: Vec<String> =
        modes_seen.iter().map(|(mode, times)| format!("{mode:04o} x{times}")).collect();
    println!("modes of {} seen while the server started: {modes_text:?}", socket.display());
    assert_eq!(modes_seen.keys().copied().collect::<Vec<_>>(), [0o600], "the socket's modes: {modes_text:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", target.server.pid())).expect("status");
    assert!(status.lines().any(|line| line == "Umask:\t0000"), "the server did not run under umask 000");

    // The directory lets anyone through: only the socket's mode keeps `nobody` out.
    std::fs::set_permissions(&target.dir, std::fs::Permissions::from_mode(0o755))
        .expect("chmod the directory");
    let connect_as_nobody = || {
        let script = "import socket, sys\n\
                      s = socket.socket(socket.AF_UNIX)\n\
                      s.settimeout(5)\n\
                      s.connect(sys.argv[1])\n\
                      s.sendall(b'version\\r\\n')\n\
                      print(s.recv(100).decode().strip())\n";
        let output = kv_support::run_bounded(
            20,
            "setpriv",
            &[
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                script,
                &socket_arg,
            ],
            None,
        );
        (output.status.success(), kv_support::text(&output))
    };
    let (connected, text) = connect_as_nobody();
    println!("nobody connecting to the 0600 socket: {text}");
    assert!(!connected && text.contains("PermissionError"), "nobody connected to the 0600 socket: {text}");
    let mut owner = std::os::unix::net::UnixStream::connect(&socket).expect("the owner connects");
    owner.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    owner.write_all(b"version\r\n").expect("send");
    let mut answer = [0u8; 64];
    let count = owner.read(&mut answer).expect("the owner's answer");
    assert!(answer[..count].starts_with(b"VERSION "), "{:?}", String::from_utf8_lossy(&answer[..count]));

    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).expect("chmod the socket");
    let (connected, text) = connect_as_nobody();
    assert!(
        connected && text.starts_with("VERSION "),
        "nobody could not connect to a 0666 socket either: {text}"
    );
    target.assert_running();
}
