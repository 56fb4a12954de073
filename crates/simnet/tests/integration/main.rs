//! The integration tests of remem-simnet, in one test binary (one link instead of one
//! per file): each file of this directory is a module, named as its file; the helpers they
//! share are `common`. Run one file's tests with
//! `cargo test -p remem-simnet --test integration MODULE::`.

mod common;

mod degraded_reads;
mod domains;
mod kv;
mod parity_stale;
mod scenarios;
