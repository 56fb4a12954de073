//! The values remem keeps in etcd, their key layout, and the checks every value read back
//! passes before anyone acts on it.
//!
//! etcd is shared infrastructure: anything with write access to the prefix can put anything
//! under it, so a record read back is hostile input. Every value has a size cap checked before
//! it is parsed, and every field that later sizes, addresses or names something is checked
//! (addresses routable and with a port, paths absolute and short enough for a Unix socket,
//! sizes consistent with each other, strings bounded).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Largest node or owner record read back.
pub const MAX_RECORD_BYTES: usize = 4096;
/// Largest slab map read back or written (etcd's own default request limit is 1.5 MiB).
pub const MAX_SLAB_MAP_BYTES: usize = 1 << 20;
/// Longest failure domain (the wire protocol's limit, remem-proto `MAX_FAILURE_DOMAIN_BYTES`).
pub const MAX_FAILURE_DOMAIN_BYTES: usize = 64;
/// Longest host name (Linux's HOST_NAME_MAX).
pub const MAX_HOSTNAME_BYTES: usize = 64;
/// Longest Unix socket path (sun_path is 108 bytes with its terminating zero).
pub const MAX_UNIX_SOCKET_BYTES: usize = 107;
/// Longest client name (an export name) used in a key.
pub const MAX_CLIENT_NAME_BYTES: usize = 64;
/// Longest key prefix.
pub const MAX_PREFIX_BYTES: usize = 128;

/// What a record or a name failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("{key}: {bytes} bytes, more than the {limit} allowed")]
    TooLarge { key: String, bytes: usize, limit: usize },
    #[error("{key}: not a valid record: {message}")]
    Parse { key: String, message: String },
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
    #[error("prefix {prefix:?}: {message}")]
    Prefix { prefix: String, message: String },
    #[error("client name {name:?}: {message}")]
    ClientName { name: String, message: String },
}

/// One memory node as it registers itself under `nodes/ADDRESS`, refreshed every few seconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Where clients connect (TCP); also the key's last part.
    pub address: SocketAddr,
    /// The node's Unix socket, usable only by clients on `hostname`.
    #[serde(default)]
    pub unix_socket: Option<PathBuf>,
    /// The host the node runs on (for the Unix socket, and for people).
    #[serde(default)]
    pub hostname: String,
    #[serde(default)]
    pub failure_domain: String,
    pub node_id: u64,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub slab_size_bytes: u64,
    pub slabs_mapped: u32,
    /// Rebuilds running on the node now.
    #[serde(default)]
    pub rebuilds_running: u32,
    /// Client ids with a live lease on the node.
    #[serde(default)]
    pub clients_live: u32,
    /// When the node last wrote this record, in milliseconds since the Unix epoch.
    #[serde(default)]
    pub updated_unix_ms: u64,
}

/// The process that owns a client's slab map, under `clients/NAME/owner`, on its session lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    pub hostname: String,
    pub pid: u32,
    /// Random, fixed for the process's lifetime: tells this process's claims from others'.
    pub session: u64,
    #[serde(default)]
    pub started_unix_ms: u64,
}

/// Where the process that serves a client (a `remem kv --etcd`) listens, under
/// `clients/NAME/endpoint`, on its owner lease: written by whoever serves, gone when it stops or
/// its lease lapses, for clients that find their server through etcd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointRecord {
    /// The TCP address clients connect to.
    pub address: SocketAddr,
    pub hostname: String,
    pub pid: u32,
    /// The owner record's session: tells this endpoint's writer among the name's owners.
    pub session: u64,
}

impl EndpointRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an endpoint record serializes")
    }

    /// Parses and checks the value of `key` (a reader must never connect where a hostile record
    /// points unless it is an address one can connect to).
    pub fn decode(key: &str, value: &[u8]) -> Result<EndpointRecord, RecordError> {
        let record: EndpointRecord = parse(key, value, MAX_RECORD_BYTES)?;
        record.validate().map_err(|message| RecordError::Invalid { key: key.to_owned(), message })?;
        Ok(record)
    }

    /// The checks of [`EndpointRecord::decode`], also run before the record is written.
    pub fn validate(&self) -> Result<(), String> {
        let ip = self.address.ip();
        if self.address.port() == 0 || ip.is_unspecified() || ip.is_multicast() {
            return Err(format!("address {} cannot be connected to", self.address));
        }
        check_text("hostname", &self.hostname, MAX_HOSTNAME_BYTES)
    }
}

impl NodeRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a node record serializes")
    }

    /// Parses and checks the value of `key`; `key_address` is the key's last part, which must
    /// be the record's own address (a record cannot speak for another node's key).
    pub fn decode(key: &str, key_address: &str, value: &[u8]) -> Result<NodeRecord, RecordError> {
        let record: NodeRecord = parse(key, value, MAX_RECORD_BYTES)?;
        record.validate().map_err(|message| RecordError::Invalid { key: key.to_owned(), message })?;
        if record.address.to_string() != key_address {
            return Err(RecordError::Invalid {
                key: key.to_owned(),
                message: format!("the record's address {} is not its key's", record.address),
            });
        }
        Ok(record)
    }

    /// The checks of [`NodeRecord::decode`], also run before a node writes its own record.
    pub fn validate(&self) -> Result<(), String> {
        if self.address.port() == 0 || self.address.ip().is_unspecified() || self.address.ip().is_multicast()
        {
            return Err(format!("address {} cannot be connected to", self.address));
        }
        if let Some(path) = &self.unix_socket {
            check_socket_path(path)?;
        }
        check_text("hostname", &self.hostname, MAX_HOSTNAME_BYTES)?;
        check_text("failure domain", &self.failure_domain, MAX_FAILURE_DOMAIN_BYTES)?;
        if self.slab_size_bytes == 0 || !self.slab_size_bytes.is_power_of_two() {
            return Err(format!("slab size {} is not a power of two", self.slab_size_bytes));
        }
        if self.capacity_bytes < self.slab_size_bytes {
            return Err(format!("capacity {} is less than one slab", self.capacity_bytes));
        }
        if self.free_bytes > self.capacity_bytes {
            return Err(format!(
                "free {} is more than the capacity {}",
                self.free_bytes, self.capacity_bytes
            ));
        }
        let mapped = u64::from(self.slabs_mapped).checked_mul(self.slab_size_bytes);
        if mapped.is_none_or(|mapped| mapped > self.capacity_bytes) {
            return Err(format!("{} slabs mapped do not fit the capacity", self.slabs_mapped));
        }
        Ok(())
    }
}

impl OwnerRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an owner record serializes")
    }

    pub fn decode(key: &str, value: &[u8]) -> Result<OwnerRecord, RecordError> {
        let record: OwnerRecord = parse(key, value, MAX_RECORD_BYTES)?;
        check_text("hostname", &record.hostname, MAX_HOSTNAME_BYTES)
            .map_err(|message| RecordError::Invalid { key: key.to_owned(), message })?;
        Ok(record)
    }
}

impl std::fmt::Display for OwnerRecord {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "pid {} on {} (session {:#x})", self.pid, self.hostname, self.session)
    }
}

/// A slab map read back: only its size is judged here; its contents are the client's to check
/// (remem-client `SlabMapFile::validate`), since only the client knows what a map must hold.
pub fn check_slab_map_size(key: &str, value: &[u8]) -> Result<(), RecordError> {
    if value.len() > MAX_SLAB_MAP_BYTES {
        return Err(RecordError::TooLarge {
            key: key.to_owned(),
            bytes: value.len(),
            limit: MAX_SLAB_MAP_BYTES,
        });
    }
    Ok(())
}

fn parse<T: serde::de::DeserializeOwned>(key: &str, value: &[u8], limit: usize) -> Result<T, RecordError> {
    if value.len() > limit {
        return Err(RecordError::TooLarge { key: key.to_owned(), bytes: value.len(), limit });
    }
    serde_json::from_slice(value)
        .map_err(|error| RecordError::Parse { key: key.to_owned(), message: error.to_string() })
}

fn check_text(what: &str, text: &str, limit: usize) -> Result<(), String> {
    if text.len() > limit {
        return Err(format!("{what} of {} bytes, more than {limit}", text.len()));
    }
    if text.chars().any(char::is_control) {
        return Err(format!("{what} {text:?} holds control characters"));
    }
    Ok(())
}

fn check_socket_path(path: &std::path::Path) -> Result<(), String> {
    let bytes = path.as_os_str().len();
    if !path.is_absolute() || bytes > MAX_UNIX_SOCKET_BYTES {
        return Err(format!("unix socket {} is not an absolute path of at most 107 bytes", path.display()));
    }
    Ok(())
}

/// The key layout under one prefix (default `/remem/`):
/// `nodes/ADDRESS`, `clients/NAME/slabmap`, `clients/NAME/owner`, `clients/NAME/endpoint`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Errors: a prefix that does not start and end with `/`, is longer than
    /// [`MAX_PREFIX_BYTES`], or holds whitespace or control characters.
    pub fn new(prefix: &str) -> Result<Keys, RecordError> {
        let error =
            |message: &str| RecordError::Prefix { prefix: prefix.to_owned(), message: message.to_owned() };
        if !prefix.starts_with('/') || !prefix.ends_with('/') {
            return Err(error("must start and end with '/' (e.g. /remem/)"));
        }
        if prefix.len() > MAX_PREFIX_BYTES {
            return Err(error("longer than 128 bytes"));
        }
        if prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(error("holds whitespace or control characters"));
        }
        Ok(Keys { prefix: prefix.to_owned() })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn nodes(&self) -> String {
        format!("{}nodes/", self.prefix)
    }

    pub fn node(&self, address: SocketAddr) -> String {
        format!("{}nodes/{address}", self.prefix)
    }

    /// The address part of a node key, if `key` is one.
    pub fn node_address<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.prefix)?.strip_prefix("nodes/")
    }

    pub fn slab_map(&self, client: &ClientName) -> String {
        format!("{}clients/{}/slabmap", self.prefix, client.0)
    }

    pub fn owner(&self, client: &ClientName) -> String {
        format!("{}clients/{}/owner", self.prefix, client.0)
    }

    pub fn endpoint(&self, client: &ClientName) -> String {
        format!("{}clients/{}/endpoint", self.prefix, client.0)
    }
}

/// The name a client's keys are under (for `remem nbd`, its export name): 1-64 bytes of
/// `[A-Za-z0-9._-]`, so it can never climb out of `clients/` or name another client's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientName(String);

impl ClientName {
    pub fn new(name: &str) -> Result<ClientName, RecordError> {
        let error =
            |message: &str| RecordError::ClientName { name: name.to_owned(), message: message.to_owned() };
        if name.is_empty() || name.len() > MAX_CLIENT_NAME_BYTES {
            return Err(error("must be 1 to 64 bytes"));
        }
        if !name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"._-".contains(&byte))
            || name.starts_with('.')
        {
            return Err(error("may hold only letters, digits, '.', '_' and '-', and not start with '.'"));
        }
        Ok(ClientName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeRecord {
        NodeRecord {
            address: "127.0.0.1:7100".parse().unwrap(),
            unix_socket: Some(PathBuf::from("/run/remem/node-0.sock")),
            hostname: "host-a".into(),
            failure_domain: "rack-1".into(),
            node_id: 7,
            capacity_bytes: 64 << 20,
            free_bytes: 32 << 20,
            slab_size_bytes: 1 << 20,
            slabs_mapped: 32,
            rebuilds_running: 0,
            clients_live: 1,
            updated_unix_ms: 1,
        }
    }

    fn decode(record: &NodeRecord) -> Result<NodeRecord, RecordError> {
        NodeRecord::decode("/remem/nodes/127.0.0.1:7100", "127.0.0.1:7100", &record.encode())
    }

    #[test]
    fn node_record_round_trips() {
        assert_eq!(decode(&node()).unwrap(), node());
    }

    #[test]
    fn node_record_for_another_key_is_refused() {
        let error = NodeRecord::decode("/remem/nodes/127.0.0.1:7101", "127.0.0.1:7101", &node().encode());
        assert!(matches!(error, Err(RecordError::Invalid { .. })), "{error:?}");
    }

    #[test]
    fn node_record_with_inconsistent_sizes_is_refused() {
        type Change = Box<dyn Fn(&mut NodeRecord)>;
        let cases: Vec<(&str, Change)> = vec![
            ("port 0", Box::new(|r| r.address = "127.0.0.1:0".parse().unwrap())),
            ("unspecified", Box::new(|r| r.address = "0.0.0.0:7100".parse().unwrap())),
            ("relative socket", Box::new(|r| r.unix_socket = Some(PathBuf::from("node.sock")))),
            (
                "long socket",
                Box::new(|r| r.unix_socket = Some(PathBuf::from(format!("/{}", "s".repeat(200))))),
            ),
            ("long domain", Box::new(|r| r.failure_domain = "d".repeat(65))),
            ("control in hostname", Box::new(|r| r.hostname = "a\nb".into())),
            ("slab not power of two", Box::new(|r| r.slab_size_bytes = 3 << 20)),
            ("slab zero", Box::new(|r| r.slab_size_bytes = 0)),
            ("capacity under a slab", Box::new(|r| r.capacity_bytes = 1 << 10)),
            ("free over capacity", Box::new(|r| r.free_bytes = 65 << 20)),
            ("too many slabs", Box::new(|r| r.slabs_mapped = 65)),
            (
                "slab count overflows",
                Box::new(|r| {
                    r.slab_size_bytes = 1 << 63;
                    r.capacity_bytes = u64::MAX;
                    r.slabs_mapped = 4;
                }),
            ),
        ];
        for (name, change) in cases {
            let mut record = node();
            change(&mut record);
            // The address case changes the key too, so decode against the record's own key.
            let key_address = record.address.to_string();
            let result = NodeRecord::decode("k", &key_address, &record.encode());
            assert!(result.is_err(), "{name}: {result:?}");
        }
    }

    #[test]
    fn oversized_and_garbage_values_are_refused() {
        let big = vec![b' '; MAX_RECORD_BYTES + 1];
        assert!(matches!(NodeRecord::decode("k", "a", &big), Err(RecordError::TooLarge { .. })));
        for garbage in [&b""[..], b"{", b"null", b"[1,2]", b"{\"address\":\"x\"}", b"\xff\xfe"] {
            assert!(matches!(NodeRecord::decode("k", "a", garbage), Err(RecordError::Parse { .. })));
            assert!(matches!(OwnerRecord::decode("k", garbage), Err(RecordError::Parse { .. })));
        }
        assert!(check_slab_map_size("k", &vec![0; MAX_SLAB_MAP_BYTES + 1]).is_err());
        assert!(check_slab_map_size("k", &vec![0; MAX_SLAB_MAP_BYTES]).is_ok());
    }

    #[test]
    fn owner_record_round_trips_and_names_its_holder() {
        let owner = OwnerRecord { hostname: "host-b".into(), pid: 42, session: 0xabc, started_unix_ms: 5 };
        let decoded = OwnerRecord::decode("k", &owner.encode()).unwrap();
        assert_eq!(decoded, owner);
        assert_eq!(decoded.to_string(), "pid 42 on host-b (session 0xabc)");
        let long = OwnerRecord { hostname: "h".repeat(65), ..owner };
        assert!(OwnerRecord::decode("k", &long.encode()).is_err());
    }

    #[test]
    fn endpoint_records_round_trip_and_hostile_ones_are_refused() {
        let endpoint = EndpointRecord {
            address: "10.0.0.5:11211".parse().unwrap(),
            hostname: "host-b".into(),
            pid: 7,
            session: 9,
        };
        assert_eq!(EndpointRecord::decode("k", &endpoint.encode()).unwrap(), endpoint);
        for address in ["0.0.0.0:11211", "10.0.0.5:0", "224.0.0.1:11211", "[::]:11211"] {
            let bad = EndpointRecord { address: address.parse().unwrap(), ..endpoint.clone() };
            assert!(EndpointRecord::decode("k", &bad.encode()).is_err(), "{address}");
        }
        let control = EndpointRecord { hostname: "a\nb".into(), ..endpoint.clone() };
        assert!(EndpointRecord::decode("k", &control.encode()).is_err());
        for garbage in [&b""[..], b"{", b"null", b"{\"address\":\"x\"}"] {
            assert!(matches!(EndpointRecord::decode("k", garbage), Err(RecordError::Parse { .. })));
        }
        assert!(matches!(
            EndpointRecord::decode("k", &vec![b' '; MAX_RECORD_BYTES + 1]),
            Err(RecordError::TooLarge { .. })
        ));
    }

    #[test]
    fn keys_follow_the_layout_and_refuse_bad_prefixes() {
        let keys = Keys::new("/remem/").unwrap();
        let name = ClientName::new("disk-1").unwrap();
        assert_eq!(keys.node("10.0.0.1:7100".parse().unwrap()), "/remem/nodes/10.0.0.1:7100");
        assert_eq!(keys.node_address("/remem/nodes/10.0.0.1:7100"), Some("10.0.0.1:7100"));
        assert_eq!(keys.node_address("/other/nodes/10.0.0.1:7100"), None);
        assert_eq!(keys.slab_map(&name), "/remem/clients/disk-1/slabmap");
        assert_eq!(keys.owner(&name), "/remem/clients/disk-1/owner");
        assert_eq!(keys.endpoint(&name), "/remem/clients/disk-1/endpoint");
        for bad in ["remem/", "/remem", "", "/a b/", &format!("/{}/", "p".repeat(130))] {
            assert!(Keys::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn client_names_cannot_leave_their_directory() {
        for good in ["remem", "disk-1", "a.b_c"] {
            assert!(ClientName::new(good).is_ok(), "{good}");
        }
        for bad in ["", "..", "a/b", "../x", ".hidden", "a b", "é", &"n".repeat(65)] {
            assert!(ClientName::new(bad).is_err(), "{bad:?}");
        }
    }
}
