//! remem-frontend: the pieces the front ends (nbd, fs, kv, swap), the demo and the benchmarks
//! share, so each is written once: the code shape (`code_args`: `-k -r --delta`), the
//! placement policy (`placement_arg`: `--placement` by `remem_placement::Policy`'s names) and
//! the transport (`transport_arg`: `--transport tcp|shm`).
//!
//! Architecture Invariant: no command lives here and nothing here does I/O beyond reading a
//! cluster file's node list; it imports no benchmark and no simulator.

pub mod code_args;
pub mod placement_arg;
pub mod transport_arg;
