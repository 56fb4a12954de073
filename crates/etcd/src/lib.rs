//! remem's cluster metadata in etcd (docs/ETCD.md): memory nodes register under a lease,
//! clients follow the membership, and each client's slab map lives in etcd, written with
//! compare-and-swap and fenced by an owner key, so a client restarted on another host finds its
//! pages and two processes claiming one client never both write.
//!
//! A small blocking API over the async `etcd-client` crate: an [`Etcd`] owns a tokio runtime
//! (one worker thread) that also runs the background tasks ([`NodeRegistration`],
//! [`MembershipWatch`], [`ClientSession`]'s keeper). Callers are plain threads; every call has a
//! deadline ([`EtcdConfig::request_timeout`]), so a stopped or unreachable etcd costs a caller
//! at most that, never a hang.
//!
//! Fault model: etcd may be down, paused, slow or restarted at any time, and any process with
//! write access to the prefix may write garbage under it. The data path never waits for etcd:
//! background tasks retry on their own, membership changes wait until it is back. Every value
//! read back is checked ([`records`]) before it is used.

mod membership;
pub mod records;
mod registration;
mod session;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use membership::MembershipWatch;
pub use records::{ClientName, EndpointRecord, Keys, NodeRecord, OwnerRecord, RecordError};
pub use registration::NodeRegistration;
pub use session::ClientSession;

/// How to reach etcd and where remem's keys are.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// `http://HOST:PORT` URLs of the etcd cluster's members.
    pub endpoints: Vec<String>,
    /// Key prefix, starting and ending with `/` (default `/remem/`).
    pub prefix: String,
    /// Deadline of one request, connection included (5 s: etcd's fsync alone can take seconds
    /// on a busy disk, and only background work and starts wait for it).
    pub request_timeout: Duration,
    /// Time to live of node and owner leases, in seconds: how long a dead process's keys last.
    pub lease_ttl_seconds: i64,
    /// How often leases are kept alive and node records refreshed.
    pub keep_alive_interval: Duration,
}

impl EtcdConfig {
    pub const DEFAULT_PREFIX: &'static str = "/remem/";

    /// Shortest owner and node lease: a keep-alive every third of it must still fit beside a
    /// slow request.
    pub const MIN_LEASE_TTL_SECONDS: i64 = 2;

    /// This configuration with leases of `seconds` (at least [`Self::MIN_LEASE_TTL_SECONDS`]),
    /// kept alive every third of that: a dead holder's keys last at most `seconds`.
    pub fn with_lease_ttl(mut self, seconds: i64) -> EtcdConfig {
        assert!(seconds >= Self::MIN_LEASE_TTL_SECONDS, "lease of {seconds} s is below the minimum");
        self.lease_ttl_seconds = seconds;
        self.keep_alive_interval = Duration::from_millis(seconds as u64 * 1000 / 3);
        self
    }

    pub fn new(endpoints: Vec<String>, prefix: &str) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            prefix: prefix.to_owned(),
            request_timeout: Duration::from_secs(5),
            lease_ttl_seconds: 10,
            keep_alive_interval: Duration::from_secs(3),
        }
    }
}

/// Parses `--etcd`'s comma-separated list of `http://HOST:PORT` URLs.
pub fn parse_endpoints(text: &str) -> Result<Vec<String>, String> {
    let endpoints: Vec<String> = text.split(',').map(str::trim).map(str::to_owned).collect();
    for endpoint in &endpoints {
        let rest = endpoint.strip_prefix("http://").ok_or_else(|| {
            format!("{endpoint:?} is not an http://HOST:PORT URL (TLS is not supported yet)")
        })?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("{endpoint:?} has no port (etcd's client port is usually 2379)"))?;
        if host.is_empty() || port.parse::<u16>().map_or(true, |port| port == 0) || rest.contains('/') {
            return Err(format!("{endpoint:?} is not an http://HOST:PORT URL"));
        }
    }
    Ok(endpoints)
}

/// Errors of calls to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd ({endpoints}): {source}")]
    Etcd { endpoints: String, source: etcd_client::Error },
    #[error("etcd ({endpoints}) did not answer within {timeout:?}")]
    Timeout { endpoints: String, timeout: Duration },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{key} is held by another live process ({holder}); stop that process, or wait for its lease to lapse if it died")]
    Held { key: String, holder: String },
    #[error("fenced: {0}; this process must stop")]
    Fenced(String),
    #[error("cannot start the etcd client's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("etcd client: {0}")]
    Client(etcd_client::Error),
    #[error("etcd: {0}")]
    Interrupted(String),
}

/// A connection to etcd (made lazily: creating one does no I/O, so a process can start while
/// etcd is down). Cheap to clone; clones share the runtime and the connection.
#[derive(Clone)]
pub struct Etcd {
    runtime: Arc<tokio::runtime::Runtime>,
    client: etcd_client::Client,
    keys: Keys,
    config: EtcdConfig,
}

impl Etcd {
    /// Errors: a bad prefix or URL, or no runtime (threads could not be started).
    pub fn new(config: EtcdConfig) -> Result<Etcd, EtcdError> {
        let keys = Keys::new(&config.prefix)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd")
            .enable_all()
            .build()
            .map_err(EtcdError::Runtime)?;
        // HTTP/2 pings find a dead or paused etcd, so streams (watches, keep-alives) end
        // instead of waiting forever on a silent connection.
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(config.request_timeout)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        let client = runtime
            .block_on(etcd_client::Client::connect(&config.endpoints, Some(options)))
            .map_err(EtcdError::Client)?;
        Ok(Etcd { runtime: Arc::new(runtime), client, keys, config })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Every valid node record, by address; records that fail their checks are skipped with a
    /// warning (a bad record must not hide the good ones).
    pub fn nodes(&self) -> Result<Vec<NodeRecord>, EtcdError> {
        let mut client = self.client.clone();
        let prefix = self.keys.nodes();
        let response = self.block_on(async move {
            client.get(prefix, Some(etcd_client::GetOptions::new().with_prefix())).await
        })?;
        Ok(membership::decode_nodes(&self.keys, response.kvs()).into_values().collect())
    }

    /// The owner record of client `name`, if a live lease holds it (read only: for a process that
    /// waits for the name to be free, as a standby does).
    ///
    /// Errors: etcd unreachable; an owner record that does not decode (held all the same: the
    /// caller must not take a name whose holder it cannot read as free).
    pub fn owner(&self, name: &ClientName) -> Result<Option<OwnerRecord>, EtcdError> {
        let key = self.keys.owner(name);
        let Some(value) = self.get(&key)? else { return Ok(None) };
        Ok(Some(OwnerRecord::decode(&key, &value)?))
    }

    /// The saved slab map of client `name`, if any, its size checked (read only: it is not
    /// remembered for a compare-and-swap, see [`ClientSession::load_map`]).
    pub fn slab_map(&self, name: &ClientName) -> Result<Option<Vec<u8>>, EtcdError> {
        let key = self.keys.slab_map(name);
        let value = self.get(&key)?;
        if let Some(value) = &value {
            records::check_slab_map_size(&key, value)?;
        }
        Ok(value)
    }

    /// The published endpoint of client `name`, if any, checked.
    pub fn endpoint(&self, name: &ClientName) -> Result<Option<EndpointRecord>, EtcdError> {
        let key = self.keys.endpoint(name);
        let Some(value) = self.get(&key)? else { return Ok(None) };
        Ok(Some(EndpointRecord::decode(&key, &value)?))
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, EtcdError> {
        let mut client = self.client.clone();
        let key = key.to_owned();
        let response = self.block_on(async move { client.get(key, None).await })?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// What background tasks hold (everything but the runtime).
    fn connection(&self) -> Connection {
        Connection { client: self.client.clone(), keys: self.keys.clone(), config: self.config.clone() }
    }

    /// Runs `future` on the runtime from a plain thread, with the request deadline.
    fn block_on<T>(
        &self,
        future: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, EtcdError> {
        self.runtime.block_on(with_deadline(&self.config, future))
    }
}

/// What a background task holds: the client and the key layout, never the runtime, so the
/// runtime is always dropped by a caller's thread, never by one of its own workers.
#[derive(Clone)]
struct Connection {
    client: etcd_client::Client,
    keys: Keys,
    config: EtcdConfig,
}

/// `future` under the request deadline, its errors named with the endpoints.
async fn with_deadline<T>(
    config: &EtcdConfig,
    future: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, EtcdError> {
    let endpoints = config.endpoints.join(",");
    match tokio::time::timeout(config.request_timeout, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(EtcdError::Etcd { endpoints, source }),
        Err(_) => Err(EtcdError::Timeout { endpoints, timeout: config.request_timeout }),
    }
}

/// This host's name (for node records and owner records), at most 64 bytes.
pub fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = name.trim().chars().filter(|c| !c.is_control()).collect();
    name.get(..records::MAX_HOSTNAME_BYTES.min(name.len())).unwrap_or("").to_owned()
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_endpoints("http://127.0.0.1:2379, http://10.0.0.2:2379").unwrap(),
            vec!["http://127.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        for bad in [
            "",
            "127.0.0.1:2379",
            "https://a:2379",
            "http://a",
            "http://:2379",
            "http://a:0",
            "http://a:2379/x",
        ] {
            assert!(parse_endpoints(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hostname_is_bounded_and_printable() {
        let name = hostname();
        assert!(name.len() <= records::MAX_HOSTNAME_BYTES);
        assert!(!name.chars().any(char::is_control));
    }
}
