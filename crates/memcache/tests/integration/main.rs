//! The integration tests of remem-memcache, in one test binary (one link instead of one
//! per file): each file of this directory is a module, named as its file; the helpers they
//! share are `common`. Run one file's tests with
//! `cargo test -p remem-memcache --test integration text::`.

mod common;

mod fuzzing;
mod meta;
mod properties;
mod responses;
mod text;
