//! memcached (the server in the limited cgroup, the driver outside it), ETC-like (95% GET,
//! ETC value sizes) and SYS-like (SET-heavy, larger values), Zipf(0.99) key popularity.
//!
//! The driver is this bench's own, over memcached's text protocol, not memcaslap: memcaslap
//! reports throughput and (with -S) min/average/max and a log2 histogram, no p50/p99, and never
//! checks a value. Here every value follows from (key, version) (see `workload`), each client
//! alone sets the keys congruent to its number and so knows their exact version, and every GET
//! is checked: exactly for the client's own keys, against the version the value's header
//! claims for others. After the timed phase every key is read back and must be exactly its
//! last version: swapping may slow memcached down, never change or lose a value. The cache is
//! sized well above the data set, so a miss is an error (an eviction would make it one too).

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::failure::{Failure, KillTimer};
use super::kv_client::{each_client, load, verify, KvConnection, Memcache};
use super::workload::{check_value, fill_value, free_port, percentiles_us, ValueSizes, Zipf};
use super::{Driven, Measurement};

pub struct Memcached {
    pub sizes: ValueSizes,
    /// The fraction of operations that are GETs (the rest are SETs of a new version).
    pub get_fraction: f64,
    pub keys: u64,
    pub seconds: f64,
    pub clients: usize,
}

impl Memcached {
    pub fn describe(&self) -> String {
        let pool = match self.sizes {
            ValueSizes::EtcLike => "ETC-like",
            ValueSizes::SysLike => "SYS-like",
        };
        format!(
            "memcached {pool} ({:.0}% GET, {} keys of {pool} sizes, Zipf 0.99, {} clients, {} s timed)",
            self.get_fraction * 100.0,
            self.keys,
            self.clients,
            self.seconds
        )
    }

    pub fn run(
        &self,
        limit: Option<&super::Limit>,
        _work_dir: &Path,
        failure: Option<Failure>,
    ) -> Result<Measurement> {
        let port = free_port()?;
        // Twice the data set and its per-item overhead: nothing is ever evicted.
        let cache_mib = self.keys * (self.sizes.mean_bytes() as u64 + 120) * 2 / (1 << 20) + 64;
        let command: Vec<String> = [
            "memcached",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-u",
            "root",
            "-l",
            "127.0.0.1",
            "-t",
            "2",
            "-m",
            &cache_mib.to_string(),
            "-c",
            "1024",
        ]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
        super::run_server(&command, limit, port, self.keys, || self.drive(port, failure))
    }

    fn drive(&self, port: u16, failure: Option<Failure>) -> Result<Driven> {
        load::<Memcache>(port, self.keys, self.sizes, self.clients)?;
        let versions: Vec<AtomicU32> = (0..self.keys).map(|_| AtomicU32::new(0)).collect();
        let zipf = Zipf::new(self.keys as usize, 0.99);
        let latencies = Mutex::new(Vec::new());
        let operations = std::sync::atomic::AtomicU64::new(0);
        let timer = KillTimer::arm(failure);
        let started = Instant::now();
        let deadline = started + Duration::from_secs_f64(self.seconds);
        each_client(self.clients, |client| {
            let (count, mut nanos) = self.client_loop(port, client, deadline, &zipf, &versions)?;
            operations.fetch_add(count, Ordering::Relaxed);
            latencies.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).append(&mut nanos);
            Ok(())
        })?;
        let seconds = started.elapsed().as_secs_f64();
        let node_killed_after = timer.finish();
        verify::<Memcache>(port, self.keys, self.sizes, &versions, self.clients)?;
        let mut nanos = latencies.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (p50_us, p99_us) = percentiles_us(&mut nanos);
        Ok(Driven {
            ops_per_second: operations.into_inner() as f64 / seconds.max(1e-9),
            seconds,
            p50_us,
            p99_us,
            node_killed_after,
        })
    }

    /// One client until the deadline: its operation count and latencies (ns).
    fn client_loop(
        &self,
        port: u16,
        client: usize,
        deadline: Instant,
        zipf: &Zipf,
        versions: &[AtomicU32],
    ) -> Result<(u64, Vec<u64>)> {
        let mut connection = Memcache::open(port)?;
        let mut rng = StdRng::seed_from_u64(7 + client as u64);
        let clients = self.clients as u64;
        let mut nanos = Vec::new();
        let mut values = Vec::new();
        let mut value = Vec::new();
        let mut scratch = Vec::new();
        while Instant::now() < deadline {
            let mut id = zipf.sample(rng.gen());
            if rng.gen::<f64>() < self.get_fraction {
                let started = Instant::now();
                connection.get_many(&[id], &mut values)?;
                nanos.push(started.elapsed().as_nanos() as u64);
                let Some(Some(read)) = values.first() else { bail!("key {id} is missing") };
                let owned = id % clients == client as u64;
                let expected = owned.then(|| versions[id as usize].load(Ordering::Relaxed));
                check_value(self.sizes, id, expected, read, &mut scratch)?;
            } else {
                // Only this client sets its own keys: the neighbour id it owns.
                id = id - id % clients + client as u64;
                if id >= self.keys {
                    id -= clients;
                }
                let version = versions[id as usize].load(Ordering::Relaxed) + 1;
                fill_value(self.sizes, id, version, &mut value);
                let started = Instant::now();
                connection.set_many(&[(id, &value)])?;
                nanos.push(started.elapsed().as_nanos() as u64);
                versions[id as usize].store(version, Ordering::Relaxed);
            }
        }
        Ok((nanos.len() as u64, nanos))
    }
}
