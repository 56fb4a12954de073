//! remem-nbd: a Network Block Device server on resilient remote memory.
//!
//! The export is an address space of remem pages: byte `b` lives in page `b / 4096`. The stock
//! Linux `nbd-client`, qemu and libnbd speak to it (fixed newstyle handshake, `NBD_OPT_GO`,
//! structured replies). See docs/NBD.md for the semantics a user may rely on.
//!
//! - [`protocol`]: wire constants, decoders, encoders (no I/O);
//! - [`handshake`]: option haggling over any `Read + Write`;
//! - [`command`]: validation of one request (which error a bad one earns);
//! - [`fuzzing`]: the decoders and validation driven by arbitrary bytes, with their oracle (the
//!   fuzz target's body, also run by a stable test);
//! - [`transmission`]: batches of requests run as page operations, replies;
//! - [`error`]: remem errors to NBD error values, in one place;
//! - [`store`]: the `PageStore` trait (the remem client, or an in-memory model for tests);
//! - [`shards`]: one store behind a lock, or one engine per core with the pages sharded;
//! - [`server`]: the listener, connection threads and slots; `session`: a connection's
//!   stream through the handshake deadline and STARTTLS; [`tls`]: certificates (rustls);
//! - `log_limit`: rate limits for lines a client can cause;
//! - [`cli`]: the `remem nbd` command (its arguments, the export opened or reopened, the listener,
//!   `--metrics`), on remem-frontend's shared pieces and remem-host's mlock and OOM score.
//!
//! Architecture Invariant: this crate uses the remem client API only; it never speaks remem's
//! wire protocol, and imports no other front end. Every length or offset from a socket is checked before it sizes a buffer or
//! addresses a page, and bad input gets an NBD error or a disconnect, never a panic.

pub mod cli;
pub mod command;
pub mod error;
pub mod fuzzing;
pub mod handshake;
mod log_limit;
pub mod protocol;
pub mod server;
mod session;
pub mod shards;
pub mod store;
pub mod tls;
pub mod transmission;

pub use handshake::Export;
pub use server::{serve, Listener, ServerConfig};
pub use shards::{ShardLayout, Shards, SharedStore};
pub use store::{MemoryStore, PageStore};
pub use tls::TlsSettings;

#[cfg(test)]
mod tests;
