//! The measurements: the load generator (`Load`) of the GET and SET series after a fill, the
//! transitions to EC(8,2) and the racing reads, each checking every value it reads back.

use std::net::SocketAddr;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::client::{ClientError, StoreOutcome, TextClient};
use super::process::ServerProcess;
use super::report::{KvSeries, RaceRow, TransitionRow};
use super::values::{looks_right, stamp, value_for};
use super::{key_space, KvBenchArgs, CLIENT_TIMEOUT};
use remem_local::stats::Samples;
use remem_local::units::format_bytes;

/// Every size and connection count against one server: fill, GET series, SET series.
pub(super) fn measure_target(
    args: &KvBenchArgs,
    server: &ServerProcess,
    series: &mut Vec<KvSeries>,
) -> Result<()> {
    for &size in &args.sizes {
        let keys = key_space(size, args.quick);
        let prefix = format!("b{size}");
        fill(server.address, &prefix, keys, size as usize)
            .with_context(|| format!("{}: filling {keys} keys of {}", server.name, format_bytes(size)))?;
        for &connections in &args.connections {
            for operation in [Operation::Get, Operation::Set] {
                let load = Load {
                    address: server.address,
                    prefix: &prefix,
                    keys,
                    value_bytes: size as usize,
                    connections,
                    ops: args.ops.max(connections),
                    limit: Duration::from_secs_f64(args.seconds.max(0.01)),
                    operation,
                };
                let (mut samples, errors, elapsed) = load.run().with_context(|| {
                    format!("{}: {} {}", server.name, operation.name(), format_bytes(size))
                })?;
                let latency = samples.summarize();
                series.push(KvSeries {
                    target: server.name.clone(),
                    operation: operation.name().to_owned(),
                    value_bytes: size,
                    connections,
                    ops_per_second: latency.count as f64 / elapsed.as_secs_f64(),
                    latency,
                    errors,
                    p50_ratio_to_memcached: None,
                    p99_ratio_to_memcached: None,
                    ops_ratio_to_memcached: None,
                });
            }
        }
    }
    Ok(())
}

/// Sets keys `<prefix>-0 .. <prefix>-(keys-1)` on 4 connections.
fn fill(address: SocketAddr, prefix: &str, keys: usize, value_bytes: usize) -> Result<()> {
    let threads = 4.min(keys);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || -> Result<()> {
                    let mut client = TextClient::connect(address, CLIENT_TIMEOUT)?;
                    for index in (thread..keys).step_by(threads) {
                        let value = value_for(index as u64, 0, value_bytes);
                        match client.set(&format!("{prefix}-{index}"), &value)? {
                            StoreOutcome::Stored => {}
                            other => bail!("set answered {other:?}"),
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|handle| handle.join().expect("fill thread panicked"))
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operation {
    Get,
    Set,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::Get => "get",
            Operation::Set => "set",
        }
    }
}

/// One series of the load generator: `connections` threads, each on its own connection, doing
/// `operation` on random keys of the filled key space until `ops` are done or `limit` passed.
struct Load<'a> {
    address: SocketAddr,
    prefix: &'a str,
    keys: usize,
    value_bytes: usize,
    connections: usize,
    ops: usize,
    limit: Duration,
    operation: Operation,
}

impl Load<'_> {
    /// Returns the latencies, the errors and misses, and the wall time from the common start to
    /// the last thread's end.
    fn run(&self) -> Result<(Samples, u64, Duration)> {
        let barrier = Barrier::new(self.connections);
        let per_thread = self.ops.div_ceil(self.connections);
        let results: Vec<Result<(Samples, u64, Duration)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..self.connections)
                .map(|thread| {
                    let barrier = &barrier;
                    scope.spawn(move || self.thread(thread, per_thread, barrier))
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().expect("load thread panicked")).collect()
        });
        let mut samples = Samples::with_capacity(self.ops);
        let mut errors = 0;
        let mut elapsed = Duration::ZERO;
        for result in results {
            let (thread_samples, thread_errors, thread_elapsed) = result?;
            samples.nanos.extend(thread_samples.nanos);
            errors += thread_errors;
            elapsed = elapsed.max(thread_elapsed);
        }
        Ok((samples, errors, elapsed))
    }

    fn thread(&self, thread: usize, count: usize, barrier: &Barrier) -> Result<(Samples, u64, Duration)> {
        let connected = TextClient::connect(self.address, CLIENT_TIMEOUT);
        // Every thread reaches the barrier, connected or not, so none waits forever.
        barrier.wait();
        let mut client = connected.context("connecting")?;
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (thread as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
        let mut value = value_for(0, 0, self.value_bytes);
        let mut read = Vec::with_capacity(self.value_bytes + 2);
        let mut samples = Samples::with_capacity(count);
        let mut errors = 0;
        let mut key = String::with_capacity(self.prefix.len() + 12);
        let started = Instant::now();
        for _ in 0..count {
            if started.elapsed() > self.limit {
                break;
            }
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let index = (state % self.keys as u64) as usize;
            key.clear();
            std::fmt::Write::write_fmt(&mut key, format_args!("{}-{index}", self.prefix))
                .expect("a String takes any text");
            let op_started = Instant::now();
            match self.operation {
                Operation::Get => match client.get_into(&key, &mut read) {
                    Ok(true) => {
                        if !looks_right(&read, index as u64, self.value_bytes) {
                            bail!("get {key}: {} bytes, not the value set", read.len());
                        }
                    }
                    Ok(false) => errors += 1,
                    Err(ClientError::Server(_)) => errors += 1,
                    Err(error) => return Err(error).with_context(|| format!("get {key}")),
                },
                Operation::Set => {
                    // The bytes `looks_right` checks as the fill wrote them, so the GET series
                    // that follow still check them.
                    stamp(&mut value, index as u64);
                    if self.value_bytes > 8 {
                        let last = self.value_bytes - 1;
                        value[last] = (last as u64).wrapping_mul(31).wrapping_add(index as u64 * 7) as u8;
                    }
                    match client.set(&key, &value) {
                        Ok(StoreOutcome::Stored) => {}
                        Ok(_) | Err(ClientError::Server(_)) => errors += 1,
                        Err(error) => return Err(error).with_context(|| format!("set {key}")),
                    }
                }
            }
            samples.push(op_started.elapsed());
        }
        Ok((samples, errors, started.elapsed()))
    }
}

/// For each size, `rounds` objects stored with rep(2) and turned to EC(8,2) the naive way, and
/// as many stored with eor2 and turned the EOR way; medians of the times. Every object is read
/// back after its transition.
pub(super) fn measure_transitions(args: &KvBenchArgs, server: &ServerProcess) -> Result<Vec<TransitionRow>> {
    let rounds = if args.quick { 1 } else { 5 };
    let mut client = TextClient::connect(server.address, CLIENT_TIMEOUT)?;
    let mut rows = Vec::new();
    for &size in &args.transition_sizes {
        let mut measured = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            for (way, (scheme, naive)) in [("rep2", true), ("eor2", false)].into_iter().enumerate() {
                let key = format!("t{size}-{scheme}-{round}");
                let value = value_for(round as u64, way as u64, size as usize);
                let answer = client
                    .meta_set(&key, &value, &format!("P{scheme}"))
                    .with_context(|| format!("ms {key} {size} P{scheme}"))?;
                if answer != "HD" {
                    bail!("ms {key} {size} P{scheme} answered {answer:?}");
                }
                let transition = client
                    .transition(&key, "ec8+2", naive)
                    .with_context(|| format!("transition {key} ec8+2"))?
                    .with_context(|| format!("transition {key}: NOT_FOUND right after it was stored"))?;
                match client.get(&key)? {
                    Some(read) if read == value => {}
                    Some(read) => {
                        bail!("{key}: {} bytes read back after the transition, not the value", read.len())
                    }
                    None => bail!("{key}: missing after its transition"),
                }
                client.delete(&key)?;
                measured[way].push(transition);
            }
        }
        let [naive, eor] = measured.map(|mut transitions| {
            transitions.sort_by_key(|transition| transition.microseconds);
            transitions[transitions.len() / 2]
        });
        let naive_bytes = (naive.bytes_read + naive.bytes_written) as f64;
        let eor_bytes = (eor.bytes_read + eor.bytes_written) as f64;
        rows.push(TransitionRow {
            value_bytes: size,
            naive,
            eor,
            bytes_saving: if naive_bytes > 0.0 { 1.0 - eor_bytes / naive_bytes } else { 0.0 },
            time_ratio: eor.microseconds as f64 / (naive.microseconds as f64).max(1.0),
        });
    }
    Ok(rows)
}

/// Racing reads on four connections. Per round: (a) connection 0 sends a SET of a fresh value
/// and, once it is on the wire, connections 1-3 send a GET of that key at once; each GET must
/// return the old or the new value, and after the SET's answer the new one; (b) all four send a
/// GET of one key at once.
pub(super) fn measure_races(args: &KvBenchArgs, server: &ServerProcess, mode: &str) -> Result<RaceRow> {
    let size = args.race_size as usize;
    let rounds = args.race_rounds.max(1);
    let mut clients: Vec<TextClient> = (0..4)
        .map(|_| TextClient::connect(server.address, CLIENT_TIMEOUT))
        .collect::<std::io::Result<_>>()?;
    let mut set = Samples::with_capacity(rounds);
    let mut after_set = Samples::with_capacity(rounds * 3);
    let mut after_get = Samples::with_capacity(rounds * 4);
    let mut new_values = 0;
    for round in 0..rounds {
        let key = format!("race-{round}");
        let old = value_for(round as u64, 1, size);
        let new = value_for(round as u64, 2, size);
        if clients[0].set(&key, &old)? != StoreOutcome::Stored {
            bail!("set {key} not stored");
        }
        // (a) one SET, three GETs.
        let barrier = Barrier::new(4);
        let results: Vec<Result<(Duration, bool)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = clients
                .iter_mut()
                .enumerate()
                .map(|(index, client)| {
                    let (barrier, key, old, new) = (&barrier, &key, &old, &new);
                    scope.spawn(move || -> Result<(Duration, bool)> {
                        if index == 0 {
                            let started = Instant::now();
                            let sent = client.send_store("set", key, 0, new);
                            barrier.wait();
                            sent?;
                            match client.read_store_reply()? {
                                StoreOutcome::Stored => Ok((started.elapsed(), true)),
                                other => bail!("racing set {key}: {other:?}"),
                            }
                        } else {
                            barrier.wait();
                            let started = Instant::now();
                            let read = client.get(key)?;
                            let elapsed = started.elapsed();
                            match read {
                                Some(value) if value == *new => Ok((elapsed, true)),
                                Some(value) if value == *old => Ok((elapsed, false)),
                                Some(value) => bail!(
                                    "get {key} racing a set: {} bytes, neither old nor new",
                                    value.len()
                                ),
                                None => bail!("get {key} racing a set: a miss"),
                            }
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().expect("race thread panicked")).collect()
        });
        for (index, result) in results.into_iter().enumerate() {
            let (elapsed, is_new) = result?;
            if index == 0 {
                set.push(elapsed);
            } else {
                after_set.push(elapsed);
                new_values += is_new as u64;
            }
        }
        if clients[1].get(&key)?.as_deref() != Some(&new[..]) {
            bail!("get {key} after the set's STORED: not the new value");
        }
        // (b) four GETs at once, of the key the previous round wrote (round 0: this one).
        let key = format!("race-{}", round.saturating_sub(1));
        let expected = value_for(round.saturating_sub(1) as u64, 2, size);
        let barrier = Barrier::new(4);
        let results: Vec<Result<Duration>> = std::thread::scope(|scope| {
            let handles: Vec<_> = clients
                .iter_mut()
                .map(|client| {
                    let (barrier, key, expected) = (&barrier, &key, &expected);
                    scope.spawn(move || -> Result<Duration> {
                        barrier.wait();
                        let started = Instant::now();
                        let read = client.get(key)?;
                        let elapsed = started.elapsed();
                        if read.as_deref() != Some(&expected[..]) {
                            bail!("get {key} of four at once: not the value set");
                        }
                        Ok(elapsed)
                    })
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().expect("race thread panicked")).collect()
        });
        for result in results {
            after_get.push(result?);
        }
    }
    Ok(RaceRow {
        mode: mode.to_owned(),
        value_bytes: size as u64,
        set: set.summarize(),
        get_after_set: after_set.summarize(),
        get_after_set_new_values: new_values,
        get_after_get: after_get.summarize(),
    })
}
