//! remem-kv: `remem kv`, a memcached-compatible cache whose values live in remem's resilient
//! remote memory, each object with its own redundancy scheme (seed 003, ElasticMem).
//!
//! Keys, flags, cas, expiry and the index stay in the server's memory; values go to remem
//! regions (one per scheme; EOR shares the EC region and adds a region of main copies pinned to
//! each EC range's first parity node). One thread runs everything: the listeners, the client
//! connections and the remem client (the poll driver), so no lock is shared on the request path.
//!
//! - `scheme.rs`: schemes and the policy that picks them; `space.rs`: page and chunk
//!   allocation; `index.rs`: entries, LRU, reference-counted locations;
//! - `cache.rs`: the work table and fetches; `writes.rs`: stores; `chunks.rs`: pages of small values
//!   being written; `transition.rs`: moving objects between schemes;
//! - `commands.rs` and `meta.rs`: what each command does; `report.rs`: `stats`;
//! - `pageio.rs`: page ops over the poll driver; `server.rs`: the event loop.
//!
//! Architecture Invariant: the crate uses only remem-client's API (never the wire protocol) and
//! remem-memcache for the memcached protocol; every byte from a socket goes through
//! `remem_memcache::parse` first. See docs/KV.md.

pub mod auth;
pub mod cache;
mod chunks;
pub mod commands;
pub mod index;
pub mod meta;
pub mod pageio;
pub mod report;
pub mod scheme;
pub mod server;
pub mod space;
pub mod stats;
pub mod transition;
mod writes;

use remem_client::{Client, ConnectError, PollClient, Shape};

pub use cache::{Cache, CacheConfig};
pub use scheme::{EcShape, Policy, Scheme};
pub use server::{Server, ServerConfig};

/// What `version` answers: memcached's major version (clients check it) and remem's.
pub const VERSION: &str = concat!("1.6.0-remem-", env!("CARGO_PKG_VERSION"));

/// Engine op slots: page ops in flight at once.
pub const PAGE_OPS_IN_FLIGHT: usize = 256;

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_secs())
        .unwrap_or(0)
}

/// The shape of a scheme's region (EOR: the EC one).
pub fn region_shape(scheme: Scheme, ec: EcShape) -> Shape {
    let (data_splits, parity_splits) = match scheme {
        Scheme::None => (1, 0),
        Scheme::Rep2 => (1, 1),
        Scheme::Rep3 => (1, 2),
        Scheme::Ec | Scheme::Eor => (ec.data_splits, ec.parity_splits),
    };
    Shape { data_splits, parity_splits, extra_reads: parity_splits.min(1) }
}

/// The schemes a server needs regions for: all of them when the policy may pick any, else the
/// ones its rules name (EC included: cold objects move there).
pub fn schemes_needed(policy: &Policy) -> Vec<Scheme> {
    match policy.fixed {
        None => Scheme::ALL.to_vec(),
        Some(fixed) => {
            let mut schemes = vec![fixed];
            for (_, scheme) in &policy.prefixes {
                if !schemes.contains(scheme) {
                    schemes.push(*scheme);
                }
            }
            schemes
        }
    }
}

/// Builds the cache over a connected client whose first region (`first`) is the EC region of
/// `region_bytes`: adds the other schemes' regions.
pub fn build_cache(
    mut client: Client,
    config: CacheConfig,
    region_bytes: u64,
) -> Result<Cache, ConnectError> {
    let needed = schemes_needed(&config.policy);
    let mut space = space::Space::new();
    let ec_region = client.regions()[0];
    space.add_region(space::RegionKind::Ec, ec_region.first_page, ec_region.page_count);
    for scheme in [Scheme::None, Scheme::Rep2, Scheme::Rep3] {
        if needed.contains(&scheme) {
            let region = client.create_region(region_shape(scheme, config.ec), region_bytes)?;
            space.add_region(space::RegionKind::of(scheme), region.first_page, region.page_count);
        }
    }
    let main_first_page = if needed.contains(&Scheme::Eor) {
        let none = region_shape(Scheme::None, config.ec);
        let main = client.create_region_beside(
            none,
            ec_region.page_count * 4096,
            &ec_region,
            config.ec.data_splits,
        )?;
        Some(main.first_page)
    } else {
        None
    };
    client.set_max_in_flight(PAGE_OPS_IN_FLIGHT);
    let cache = Cache::new(PollClient::new(client), space, config, main_first_page);
    Ok(cache)
}
