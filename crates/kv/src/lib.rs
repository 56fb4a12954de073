//! remem-kv: `remem kv`, a memcached-compatible cache whose values live in remem's resilient
//! remote memory, each object with its own redundancy scheme (seed 003, ElasticMem).
//!
//! Keys, flags, cas, expiry and the index stay in the server's memory; values go to remem
//! regions (one per scheme; EOR shares the EC region and adds a region of main copies pinned to
//! each EC range's first parity node). One thread runs everything: the listeners, the client
//! connections and the remem client (the poll driver), so no lock is shared on the request path.
//!
//! Three layers, each importing only those below it (docs/ARCHITECTURE.md, crates/kv):
//! - protocol: `dispatch.rs` (the one dispatcher: requests to `text.rs` or `meta.rs`, built on
//!   `commands.rs`; the engine's completions to replies), `reply.rs` (rendering, the outbox),
//!   `report.rs` (`stats`); `server.rs` (the event loop) and `standby.rs` beside it;
//! - engine: `cache/` (the work table, fetches; `writes.rs` stores, `transition.rs` moves between
//!   schemes as tasks, `durability.rs` and `rewrites.rs` what survives a restart, `open.rs` the
//!   regions), `index.rs` (entries, LRU, reference-counted locations), `space.rs` (page and
//!   chunk allocation), `chunks.rs` (pages of small values being written), `pageio.rs` (page ops
//!   over the page client), `page_client.rs` (`PageClient`, all the engine asks of its client:
//!   the poll driver in the server, the simulator in crates/simnet's tests), `budget.rs` (bytes held for replies), `backup/`; it never calls up:
//!   what finishes waits in `Cache::completions` as typed [`completion::Completion`]s;
//! - vocabulary, below both: `completion.rs`, `error.rs` (typed errors; it wraps
//!   `backup::BackupError`, which names nothing above it), `clock.rs`,
//!   `scheme.rs`, `stats.rs`, `latency.rs`, `size_class.rs` (the classes `stats slabs` reports by);
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
pub mod clock;
pub mod commands;
pub mod completion;
pub mod dispatch;
pub mod error;
pub mod index;
pub mod latency;
#[cfg(test)]
mod layering;
pub mod meta;
pub mod page_client;
pub mod pageio;
pub mod reply;
pub mod report;
pub mod scheme;
pub mod server;
pub mod size_class;
mod sockets;
pub mod space;
pub mod standby;
pub mod stats;
pub mod text;
mod tls;
mod writers;

pub use cache::open::{build_cache, cache_over_regions, MAIN_COPIES_LABEL};
pub use cache::{Cache, CacheConfig};
pub use clock::now_unix;
pub use page_client::PageClient;
pub use pageio::PAGE_OPS_IN_FLIGHT;
pub use report::VERSION;
pub use scheme::{region_shape, schemes_needed, EcShape, Policy, Scheme};
pub use server::{Server, ServerConfig};
