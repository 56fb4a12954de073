//! Ports for servers that must be told theirs before they start (etcd, a standby that binds at
//! takeover, memcached and redis under the benchmarks, Prometheus).
//!
//! A port found by binding port 0 and letting go is from the kernel's ephemeral range, the range
//! every other socket bound to port 0 (or connecting) draws from: on a machine running ten tests
//! at once one of them took such a port between the look and the server's bind. Ports below the
//! ephemeral range are never handed out that way; only another caller of this function could
//! take the same one, and it picks at random among thousands.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Where to look when the ephemeral range cannot be read (Linux's default starts at 32768).
const DEFAULT_EPHEMERAL_LOW: u16 = 32_768;
/// The lowest port handed out: above the well-known and most registered services' ports.
const LOWEST: u16 = 20_000;
/// Ports tried before giving up (each a bind on 127.0.0.1).
const ATTEMPTS: u64 = 1_000;

/// A port on 127.0.0.1 free right now, below the kernel's ephemeral range (see the module
/// documentation).
pub fn unassigned_port() -> std::io::Result<u16> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let high = ephemeral_low().unwrap_or(DEFAULT_EPHEMERAL_LOW);
    if high <= LOWEST + 100 {
        // An unusual range: fall back to the kernel's choice.
        return Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
    }
    let span = u64::from(high - LOWEST);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| u64::from(elapsed.subsec_nanos()));
    let mut state = (u64::from(std::process::id()) << 32) ^ nanos ^ CALLS.fetch_add(1, Relaxed) << 48;
    for _ in 0..ATTEMPTS {
        // xorshift: a different sequence in every process and call.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let port = LOWEST + (state % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free port among {ATTEMPTS} tried between {LOWEST} and {high}"),
    ))
}

/// The first port of the kernel's ephemeral range.
fn ephemeral_low() -> Option<u16> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_below_the_ephemeral_range_and_differ_from_call_to_call() {
        let high = ephemeral_low().unwrap_or(DEFAULT_EPHEMERAL_LOW);
        let ports: Vec<u16> = (0..8).map(|_| unassigned_port().expect("a free port")).collect();
        for &port in &ports {
            assert!((LOWEST..high).contains(&port), "port {port} outside {LOWEST}..{high}");
            TcpListener::bind(("127.0.0.1", port)).expect("still free");
        }
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() >= 7, "random picks: {ports:?}");
    }
}
