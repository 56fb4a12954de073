//! Slab leases: which process holds each client id on this node, and when the slabs of a client
//! that went away are freed.
//!
//! A client process claims its client id with a random session (`Control::Hello::session`) on
//! every connection. The lease of that session is live while it has a connection open, and a
//! claimed connection stays open only while the process renews it: the client's engine sends a
//! heartbeat on a connection that heard nothing for a second, and the node closes a claimed
//! connection that sent nothing for the lease timeout ([`Leases::timeout`], `--lease-timeout`).
//! So a process that is stopped (SIGSTOP, a debugger, a hung event loop) loses its lease as a
//! dead one does, although its kernel still answers TCP keepalive; and TCP keepalive
//! (`connection::keepalive`) closes the connections of a host that died or was cut off.
//! A lapsed lease keeps the client's slabs for the grace period (`--lease-grace`), so that the
//! same client restarted with its saved slab map re-attaches to them; after that, they are freed.
//!
//! Fencing: while a session's lease is live, a connection claiming the same client id with
//! another session is refused (`ErrorCode::ClientIdInUse`): two processes never own the same
//! slabs at once. Once the lease has lapsed, the next session takes the id over, and the old one
//! is refused from then on. Session 0 claims nothing: tools acting for whoever holds the id
//! (fault injection, status) neither take a lease nor keep one alive.
//!
//! Invariants: a client id has at most one session. A lease with connections open never
//! expires. Expiry and the freeing of the slabs happen under the lease lock, so a claim that
//! comes during a freeing waits for it and then starts afresh.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The default grace period: long enough to restart a front end (an upgrade, a crash and a
/// service manager's restart), short enough that a dead client's memory comes back soon.
pub const DEFAULT_LEASE_GRACE: Duration = Duration::from_secs(120);
/// The default lease timeout: ten of the reference client's heartbeats (one a second when idle),
/// so a busy host's scheduling hiccup is not taken for a stopped process.
pub const DEFAULT_LEASE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Lease {
    session: u64,
    /// Connections of this session open now.
    connections: u32,
    /// When the last connection closed, while none is open.
    lapsed_at: Option<Instant>,
}

/// Why a claim was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct ClaimRefused {
    /// Connections the holding session has open.
    pub holder_connections: u32,
}

impl std::fmt::Display for ClaimRefused {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "another session holds this client id with a live lease ({} connection(s) open)",
            self.holder_connections
        )
    }
}

/// Lease counts for `NodeInfoReply` and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseCounts {
    pub live: u32,
    pub in_grace: u32,
}

/// Every claimed client id of the node.
pub struct Leases {
    grace: Duration,
    timeout: Duration,
    leases: Mutex<BTreeMap<u64, Lease>>,
}

impl Leases {
    pub fn new(grace: Duration, timeout: Duration) -> Leases {
        Leases { grace, timeout, leases: Mutex::new(BTreeMap::new()) }
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// A claimed connection that sends nothing (no request, no heartbeat) for this long is
    /// closed: its process stopped renewing the lease.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Lease>> {
        // Every step leaves the map consistent; a poisoned lock is no reason to stop serving.
        self.leases.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A connection authenticated as `client_id` with `session`: counts it toward the lease, or
    /// takes a lapsed lease over, or refuses it because another session's lease is live.
    /// Returns whether the connection took over from another session (for the log).
    pub fn claim(&self, client_id: u64, session: u64) -> Result<bool, ClaimRefused> {
        if session == 0 {
            return Ok(false);
        }
        let mut leases = self.lock();
        let lease = leases.entry(client_id).or_insert(Lease { session, connections: 0, lapsed_at: None });
        let took_over = lease.session != session;
        if took_over && lease.connections > 0 {
            return Err(ClaimRefused { holder_connections: lease.connections });
        }
        lease.session = session;
        lease.connections += 1;
        lease.lapsed_at = None;
        Ok(took_over)
    }

    /// A connection of a claimed lease closed; the last one starts the grace period.
    pub fn release(&self, client_id: u64, session: u64, now: Instant) {
        if session == 0 {
            return;
        }
        let mut leases = self.lock();
        if let Some(lease) = leases.get_mut(&client_id) {
            if lease.session == session && lease.connections > 0 {
                lease.connections -= 1;
                if lease.connections == 0 {
                    lease.lapsed_at = Some(now);
                }
            }
        }
    }

    /// Removes the leases whose grace period ended by `now` and calls `free` for each client id,
    /// while holding the lease lock (so nobody re-claims an id whose slabs are being freed).
    /// A lapsed lease whose client holds no slab (`has_slabs` false: a start that failed and
    /// released what it mapped) has nothing to keep and ends at once.
    /// Returns how many leases expired.
    pub fn expire(&self, now: Instant, has_slabs: impl Fn(u64) -> bool, mut free: impl FnMut(u64)) -> usize {
        let mut leases = self.lock();
        let grace = self.grace;
        leases.retain(|&client_id, lease| lease.lapsed_at.is_none() || has_slabs(client_id));
        let expired: Vec<u64> = leases
            .iter()
            .filter(|(_, lease)| {
                lease.lapsed_at.is_some_and(|lapsed| now.saturating_duration_since(lapsed) >= grace)
            })
            .map(|(&client_id, _)| client_id)
            .collect();
        for client_id in &expired {
            leases.remove(client_id);
            free(*client_id);
        }
        expired.len()
    }

    /// Client ids whose lease lapsed and whose slabs wait for the end of the grace period.
    pub fn in_grace(&self) -> Vec<u64> {
        self.lock().iter().filter(|(_, lease)| lease.lapsed_at.is_some()).map(|(&id, _)| id).collect()
    }

    pub fn counts(&self) -> LeaseCounts {
        let leases = self.lock();
        let in_grace = leases.values().filter(|lease| lease.lapsed_at.is_some()).count() as u32;
        LeaseCounts { live: leases.len() as u32 - in_grace, in_grace }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_lease_fences_other_sessions_and_a_lapsed_one_is_taken_over() {
        let leases = Leases::new(Duration::from_secs(10), DEFAULT_LEASE_TIMEOUT);
        let start = Instant::now();
        assert_eq!(leases.claim(7, 1), Ok(false));
        assert_eq!(leases.claim(7, 1), Ok(false), "a second connection of the same session");
        assert_eq!(leases.claim(7, 2), Err(ClaimRefused { holder_connections: 2 }));
        assert_eq!(leases.claim(7, 0), Ok(false), "session 0 claims nothing and is never refused");
        leases.release(7, 1, start);
        assert!(leases.claim(7, 2).is_err(), "one connection still open");
        leases.release(7, 1, start);
        assert_eq!(leases.counts(), LeaseCounts { live: 0, in_grace: 1 });
        assert_eq!(leases.claim(7, 2), Ok(true), "lapsed: taken over");
        assert_eq!(
            leases.claim(7, 1),
            Err(ClaimRefused { holder_connections: 1 }),
            "the old session is fenced"
        );
        leases.release(7, 1, start);
        assert_eq!(leases.counts(), LeaseCounts { live: 1, in_grace: 0 }, "a stale release changes nothing");
    }

    #[test]
    fn slabs_are_freed_only_after_the_grace_period_and_never_while_connected() {
        let leases = Leases::new(Duration::from_secs(10), DEFAULT_LEASE_TIMEOUT);
        let start = Instant::now();
        leases.claim(1, 11).unwrap();
        leases.claim(2, 22).unwrap();
        leases.release(1, 11, start);
        let mut freed = Vec::new();
        assert_eq!(leases.expire(start + Duration::from_secs(9), |_| true, |id| freed.push(id)), 0);
        assert_eq!(leases.expire(start + Duration::from_secs(3600), |_| true, |id| freed.push(id)), 1);
        assert_eq!(freed, vec![1], "client 2 is connected: its lease never expires");
        assert_eq!(leases.counts(), LeaseCounts { live: 1, in_grace: 0 });
        assert_eq!(leases.claim(1, 33), Ok(false), "an expired id starts afresh");
    }

    #[test]
    fn a_reconnection_within_the_grace_period_keeps_the_slabs() {
        let leases = Leases::new(Duration::from_secs(10), DEFAULT_LEASE_TIMEOUT);
        let start = Instant::now();
        leases.claim(5, 9).unwrap();
        leases.release(5, 9, start);
        assert_eq!(leases.in_grace(), vec![5]);
        leases.claim(5, 9).unwrap();
        assert!(leases.in_grace().is_empty());
        assert_eq!(leases.expire(start + Duration::from_secs(60), |_| true, |_| panic!("renewed")), 0);
    }

    #[test]
    fn a_lapsed_lease_without_slabs_ends_at_once() {
        let leases = Leases::new(Duration::from_secs(10), DEFAULT_LEASE_TIMEOUT);
        let start = Instant::now();
        leases.claim(3, 4).unwrap();
        leases.claim(6, 7).unwrap();
        leases.release(3, 4, start);
        assert_eq!(leases.expire(start, |_| false, |_| panic!("nothing to free")), 0);
        assert_eq!(leases.counts(), LeaseCounts { live: 1, in_grace: 0 }, "the live one stays");
    }
}
