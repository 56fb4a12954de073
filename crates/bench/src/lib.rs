//! remem-bench: the benchmarks behind `remem bench` (the subcommand itself stays in the cli,
//! thin). Each prints ratios against a baseline measured in the same run, because these machines
//! are noisy: `bench` (page reads and writes per scheme beside their floors, `bench_floor`),
//! `codec_bench` (our ISA-L build against Debian's), `encrypt_bench` (`--encryption`: EC(8,2)
//! over TCP, plaintext against `--encrypt`), `regen_bench` (a slab rebuilt against
//! reading its sources), `kv_bench` (`remem kv` against memcached), `kv_ha_bench` (the kv's standby modes, restarts
//! and failovers), `apps_bench` (unmodified applications at 100/75/50% of their memory on remem
//! swap, against a disk swap file), `fs_bench` (`remem fs` beside tmpfs and the local disk: fio,
//! sqlite3, tar); `plot` (latency CDFs) is remem-plot's.
//!
//! Architecture Invariant: production code never imports this crate except the `remem bench`
//! dispatch; benchmarks start real node processes through remem-local and check every byte they
//! read.

pub mod apps_bench;
pub mod bench;
pub mod bench_floor;
pub mod codec_bench;
pub mod encrypt_bench;
pub mod fs_bench;
pub mod kv_bench;
pub mod kv_ha_bench;
pub mod regen_bench;

// The plots are remem-plot's (remem sim draws with it too); here under the path they had.
pub use remem_plot as plot;
