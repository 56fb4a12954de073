//! remem-host: what remem asks of the host it runs on, beside memory nodes: `cgroup` (a command
//! in a fresh memory cgroup, measured and cleaned up: `remem run`, `remem bench apps`), `swap`
//! (a remem swap device for the life of a value, and the system tools its set-up runs) and
//! `process` (mlock and the OOM score of a server that may back swap: `remem nbd`, `remem fs`).
//!
//! Architecture Invariant: nothing here knows the front ends' protocols; a swap device is made by
//! running the `remem` binary it is given.

pub mod cgroup;
pub mod paging;
pub mod process;
pub mod swap;
