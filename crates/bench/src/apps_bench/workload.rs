//! What the key-value applications (memcached, redis) share: values whose every byte follows
//! from `(key id, version)`, so a read can be checked exactly, value sizes drawn like Facebook's
//! ETC and SYS pools, Zipf key popularity, latency percentiles, and waiting for a server port.

use std::io::{BufRead, Read};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use remem_host::cgroup::LimitedChild;

/// The header every value starts with: the key id (16 hex digits) and its version (8).
pub const VALUE_HEADER_BYTES: usize = 24;
/// Values are never shorter than the header and a little payload.
pub const VALUE_MIN_BYTES: usize = 32;

/// Value sizes like a pool of Atikoglu et al. (SIGMETRICS 2012): ETC's are a generalized Pareto
/// (scale 214.5, shape 0.348: mostly a few hundred bytes, a long tail); SYS's, four times larger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueSizes {
    EtcLike,
    SysLike,
}

impl ValueSizes {
    /// The length of version `version` of key `id`: a fixed function of both.
    pub fn length(self, id: u64, version: u32) -> usize {
        let scale = match self {
            ValueSizes::EtcLike => 214.476,
            ValueSizes::SysLike => 857.9,
        };
        let shape = 0.348238;
        // A uniform in [0, 1) from the hash's top 53 bits.
        let uniform = (mix(id ^ (u64::from(version) << 40) ^ 0x5a5a) >> 11) as f64 / (1u64 << 53) as f64;
        let length = scale / shape * ((1.0 - uniform).powf(-shape) - 1.0);
        (length as usize).clamp(VALUE_MIN_BYTES, 16 * 1024)
    }

    /// The mean length, near enough to size a server's cache.
    pub fn mean_bytes(self) -> usize {
        match self {
            ValueSizes::EtcLike => 330,
            ValueSizes::SysLike => 1300,
        }
    }
}

/// SplitMix64's finalizer: a bijective mix of 64 bits.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Writes version `version` of key `id` into `out` (cleared first): the header, then bytes of a
/// xorshift stream seeded from both.
pub fn fill_value(sizes: ValueSizes, id: u64, version: u32, out: &mut Vec<u8>) {
    let length = sizes.length(id, version);
    out.clear();
    out.extend_from_slice(format!("{id:016x}{version:08x}").as_bytes());
    let mut state = mix(id.wrapping_mul(31).wrapping_add(u64::from(version))) | 1;
    while out.len() < length {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let take = (length - out.len()).min(8);
        out.extend_from_slice(&state.to_le_bytes()[..take]);
    }
}

/// The version a value claims in its header, if the header names key `id`.
pub fn claimed_version(id: u64, value: &[u8]) -> Option<u32> {
    let header = std::str::from_utf8(value.get(..VALUE_HEADER_BYTES)?).ok()?;
    let claimed_id = u64::from_str_radix(&header[..16], 16).ok()?;
    (claimed_id == id).then(|| u32::from_str_radix(&header[16..], 16).ok()).flatten()
}

/// Checks `value` as key `id`'s: exactly version `expected` if given, else whichever version
/// its header claims (a key another client writes), byte for byte.
pub fn check_value(
    sizes: ValueSizes,
    id: u64,
    expected: Option<u32>,
    value: &[u8],
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let Some(version) = claimed_version(id, value) else {
        bail!("key {id}: a value that is not this key's ({} bytes)", value.len());
    };
    if let Some(expected) = expected {
        if version != expected {
            bail!("key {id}: version {version} read, {expected} last written");
        }
    }
    fill_value(sizes, id, version, scratch);
    if scratch != value {
        bail!("key {id} version {version}: wrong bytes ({} read, {} expected)", value.len(), scratch.len());
    }
    Ok(())
}

/// Zipf popularity over `count` keys (rank r drawn with weight 1/r^exponent), ranks scattered
/// over key ids so the hot keys are not neighbours in the server's memory.
pub struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    pub fn new(count: usize, exponent: f64) -> Zipf {
        assert!(count > 0, "callers validate the key count");
        let mut total = 0.0;
        let cumulative = (1..=count)
            .map(|rank| {
                total += 1.0 / (rank as f64).powf(exponent);
                total
            })
            .collect::<Vec<_>>();
        Zipf { cumulative: cumulative.into_iter().map(|sum| sum / total).collect() }
    }

    /// A key id for the uniform `unit` in [0, 1).
    pub fn sample(&self, unit: f64) -> u64 {
        let rank = self.cumulative.partition_point(|&sum| sum < unit).min(self.cumulative.len() - 1) as u64;
        let count = self.cumulative.len() as u64;
        // A hash scatters ranks over ids; the few ranks that share an id only sharpen the skew.
        mix(rank) % count
    }
}

/// p50 and p99 of latencies in nanoseconds, in microseconds; sorts `nanos`.
pub fn percentiles_us(nanos: &mut [u64]) -> (Option<f64>, Option<f64>) {
    if nanos.is_empty() {
        return (None, None);
    }
    nanos.sort_unstable();
    let at = |fraction: f64| {
        let index = ((nanos.len() as f64 * fraction).ceil() as usize).saturating_sub(1).min(nanos.len() - 1);
        nanos[index] as f64 / 1000.0
    };
    (Some(at(0.50)), Some(at(0.99)))
}

/// A port on 127.0.0.1 free a moment ago (the server binds it next).
pub fn free_port() -> Result<u16> {
    remem_local::ports::unassigned_port().context("finding a free port")
}

/// Connects to a server the bench started, waiting up to `timeout` for it to listen; errors
/// early when it exited. Reads and writes time out after two minutes: a stuck server fails
/// the run instead of hanging the bench.
pub fn connect(server: &mut LimitedChild, port: u16, timeout: Duration) -> Result<TcpStream> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(code) = server.try_wait()? {
            bail!("the server exited with status {code} before it listened on port {port}");
        }
        match TcpStream::connect_timeout(&address, Duration::from_secs(1)) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(Duration::from_secs(120)))?;
                stream.set_write_timeout(Some(Duration::from_secs(120)))?;
                return Ok(stream);
            }
            Err(error) if Instant::now() >= deadline => {
                return Err(error).with_context(|| format!("connecting to the server on port {port}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Another connection to a server already listening.
pub fn connect_again(port: u16) -> Result<TcpStream> {
    let stream = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .with_context(|| format!("connecting to the server on port {port}"))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    stream.set_write_timeout(Some(Duration::from_secs(120)))?;
    Ok(stream)
}

/// Reads one line ending in `\r\n` (returned without it) of at most 1 KiB: a reply line of a
/// text protocol. Errors at end of stream or on a longer line.
pub fn read_reply_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> Result<()> {
    line.clear();
    reader.by_ref().take(1024).read_until(b'\n', line).context("reading a reply")?;
    if line.is_empty() {
        bail!("the server closed the connection");
    }
    if !line.ends_with(b"\r\n") {
        bail!("a reply line longer than 1 KiB or cut short: {:?}", String::from_utf8_lossy(line));
    }
    line.truncate(line.len() - 2);
    Ok(())
}

/// Reads exactly `length` bytes and the `\r\n` after them into `out`.
pub fn read_data_block(reader: &mut impl BufRead, length: usize, out: &mut Vec<u8>) -> Result<()> {
    if length > 1 << 20 {
        bail!("a {length}-byte value, over the 1 MiB the bench ever stores");
    }
    out.resize(length + 2, 0);
    reader.read_exact(out).context("reading a value")?;
    if !out.ends_with(b"\r\n") {
        bail!("a value not followed by \\r\\n");
    }
    out.truncate(length);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_checks_as_its_own_version_and_no_other() {
        let mut value = Vec::new();
        let mut scratch = Vec::new();
        for sizes in [ValueSizes::EtcLike, ValueSizes::SysLike] {
            for id in [0u64, 7, 123_456] {
                fill_value(sizes, id, 3, &mut value);
                assert!(value.len() >= VALUE_MIN_BYTES);
                check_value(sizes, id, Some(3), &value, &mut scratch).expect("its own version");
                check_value(sizes, id, None, &value, &mut scratch).expect("any claimed version");
                assert!(check_value(sizes, id, Some(4), &value, &mut scratch).is_err());
                assert!(check_value(sizes, id + 1, None, &value, &mut scratch).is_err());
                let last = value.len() - 1;
                value[last] ^= 1;
                assert!(check_value(sizes, id, None, &value, &mut scratch).is_err());
            }
        }
        assert!(check_value(ValueSizes::EtcLike, 1, None, b"short", &mut scratch).is_err());
    }

    #[test]
    fn etc_sizes_average_a_few_hundred_bytes_and_zipf_prefers_few_keys() {
        let mean = (0..20_000u64).map(|id| ValueSizes::EtcLike.length(id, 0)).sum::<usize>() / 20_000;
        assert!((200..500).contains(&mean), "mean ETC-like value {mean} bytes");
        let zipf = Zipf::new(10_000, 0.99);
        let mut hits = std::collections::HashMap::new();
        for step in 0..10_000 {
            *hits.entry(zipf.sample(step as f64 / 10_000.0)).or_insert(0) += 1;
        }
        let hottest = hits.values().max().copied().unwrap_or(0);
        assert!(hottest > 500, "the hottest key got {hottest} of 10000 draws");
        let (p50, p99) = percentiles_us(&mut (1..=100).map(|us| us * 1000).collect::<Vec<u64>>());
        assert_eq!((p50, p99), (Some(50.0), Some(99.0)));
    }
}
