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
//! - `cache.rs`: the engine (the work table and fetches); `writes.rs`: stores; `chunks.rs`: pages
//!   of small values being written; `transition.rs`: moving objects between schemes; the engine
//!   never calls up: fetched read-modify-write values wait in `Cache::rmw_values`;
//! - `dispatch.rs`: a request to `text.rs` or `meta.rs`, built on `commands.rs` (the operations
//!   both share, and `settle`, which applies what the engine handed up); `reply.rs`: replies and
//!   their rendering; `report.rs`: `stats`;
//! - `pageio.rs`: page ops over the poll driver; `server.rs`: the event loop; `budget.rs`: the
//!   bytes held for replies and when a connection may start more;
//! - `cli/`: the `remem kv` command (its arguments, the start, the state directory and the
//!   standby side), above everything else here.
//!
//! Architecture Invariant: the crate uses only remem-client's API (never the wire protocol) and
//! remem-memcache for the memcached protocol; every byte from a socket goes through
//! `remem_memcache::parse` first. See docs/KV.md.

pub mod auth;
pub mod backup;
pub mod budget;
pub mod cache;
mod chunks;
pub mod cli;
pub mod commands;
pub mod dispatch;
pub mod durability;
pub mod index;
pub mod latency;
pub mod meta;
pub mod pageio;
pub mod reply;
pub mod report;
pub mod rewrites;
pub mod scheme;
pub mod server;
pub mod space;
pub mod standby;
pub mod stats;
pub mod text;
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

/// What `remem status` and the client's region report call the region of EOR values' main
/// copies (its scheme, `none`, is also that of `none` values).
pub const MAIN_COPIES_LABEL: &str = "EOR main copies";

/// Builds the cache over a connected client whose first region (`first`) is the EC region of
/// `region_bytes`: adds the other schemes' regions.
pub fn build_cache(
    mut client: Client,
    config: CacheConfig,
    region_bytes: u64,
) -> Result<Cache, ConnectError> {
    let needed = schemes_needed(&config.policy);
    let ec_region = client.regions()[0];
    for scheme in [Scheme::None, Scheme::Rep2, Scheme::Rep3] {
        if needed.contains(&scheme) {
            client.create_region(region_shape(scheme, config.ec), region_bytes)?;
        }
    }
    if needed.contains(&Scheme::Eor) {
        let none = region_shape(Scheme::None, config.ec);
        client.create_region_beside(none, ec_region.page_count * 4096, &ec_region, config.ec.data_splits)?;
    }
    cache_over_regions(client, config).map_err(|message| unreachable!("regions made just now: {message}"))
}

/// The cache over a client that has its regions already (a reopened slab map): the EC region,
/// then none, rep2 and rep3 when the policy needs them, then EOR's main copies beside the EC
/// region, in the order [`build_cache`] makes them. Errors when the client's regions are not
/// those (a map saved with other schemes or another shape).
pub fn cache_over_regions(mut client: Client, config: CacheConfig) -> Result<Cache, String> {
    let needed = schemes_needed(&config.policy);
    let regions = client.regions();
    let mut expected = vec![(Some(space::RegionKind::Ec), region_shape(Scheme::Ec, config.ec))];
    for (scheme, kind) in [
        (Scheme::None, space::RegionKind::None),
        (Scheme::Rep2, space::RegionKind::Rep2),
        (Scheme::Rep3, space::RegionKind::Rep3),
    ] {
        if needed.contains(&scheme) {
            expected.push((Some(kind), region_shape(scheme, config.ec)));
        }
    }
    if needed.contains(&Scheme::Eor) {
        expected.push((None, region_shape(Scheme::None, config.ec)));
    }
    let shapes = |shapes: Vec<Shape>| {
        shapes
            .iter()
            .map(|shape| format!("({},{})", shape.data_splits, shape.parity_splits))
            .collect::<Vec<_>>()
    };
    let have: Vec<Shape> = regions.iter().map(|region| region.shape).collect();
    let want: Vec<Shape> = expected.iter().map(|(_, shape)| *shape).collect();
    let same = have.len() == want.len()
        && have
            .iter()
            .zip(&want)
            .all(|(a, b)| (a.data_splits, a.parity_splits) == (b.data_splits, b.parity_splits));
    if !same {
        return Err(format!(
            "the saved regions have shapes {:?}, these flags need {:?}",
            shapes(have),
            shapes(want)
        ));
    }
    let mut space = space::Space::new();
    let mut main_first_page = None;
    let mut journal_first_page = 0;
    for (region, (kind, _)) in regions.iter().zip(&expected) {
        match kind {
            // The EC region's last pages are the journal of chunk page rewrites.
            Some(space::RegionKind::Ec) => {
                if region.page_count <= 2 * rewrites::JOURNAL_PAGES {
                    return Err(format!("the EC region of {} pages is too small", region.page_count));
                }
                let values = region.page_count - rewrites::JOURNAL_PAGES;
                space.add_region(space::RegionKind::Ec, region.first_page, values);
                journal_first_page = region.first_page + values;
            }
            Some(kind) => space.add_region(*kind, region.first_page, region.page_count),
            None => {
                main_first_page = Some(region.first_page);
                client.label_region(region.index, MAIN_COPIES_LABEL);
            }
        }
    }
    client.set_max_in_flight(PAGE_OPS_IN_FLIGHT);
    let mut cache = Cache::new(PollClient::new(client), space, config, main_first_page);
    cache.journal_first_page = journal_first_page;
    cache.journal_free = (0..rewrites::JOURNAL_PAGES as u32).rev().collect();
    Ok(cache)
}
