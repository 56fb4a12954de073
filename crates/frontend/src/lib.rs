//! remem-frontend: the foundation the front ends (nbd, fs, kv, swap), the demo and the
//! benchmarks share, so each piece is written once: the code shape (`code_args`: `-k -r
//! --delta`), the placement policy (`placement_arg`: `--placement` by `remem_placement::Policy`'s
//! names), the transport (`transport_arg`: `--transport tcp|shm`), sizes and counts (`units`),
//! the cluster file, its directory and private files (`cluster_file`), a locked state
//! directory (`state_dir`), where an export's nodes and slab map live, a cluster file or etcd
//! (`export_home`, with `--etcd`), following the cluster file (`cluster_watch`), the region
//! report `remem status` reads (`client_report`), the Prometheus endpoint (`metrics`) and the
//! page store under nbd and fs with its in-memory model (`page_store`).
//!
//! Architecture Invariant: no command lives here; it imports no front end, no benchmark, no
//! simulator and not the local-cluster kit (remem-local depends on it, not the other way round).

pub mod client_args;
pub mod client_report;
pub mod cluster_file;
pub mod cluster_watch;
pub mod code_args;
pub mod export_home;
pub mod metrics;
pub mod open;
pub mod page_store;
pub mod placement_arg;
pub mod process;
pub mod state_dir;
pub mod tls;
pub mod transport_arg;
pub mod units;
