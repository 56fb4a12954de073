//! The integration tests of remem-node, in one test binary (one link instead of one
//! per file): each file of this directory is a module, named as its file; the helpers they
//! share are `common`. Run one file's tests with
//! `cargo test -p remem-node --test integration MODULE::`.

mod common;

mod buffers;
mod encrypt;
mod faults;
mod monitor;
mod node;
mod random_frames;
mod regeneration;
