//! The `remem` command line: node daemon, local cluster, demo and benchmarks.
//!
//! The binary (`main.rs`) only parses arguments and dispatches; each command lives in a module
//! here or, for the front ends and the simulator, in its own crate, so the tests can drive the
//! same code.

pub mod completions;
pub mod config_file;
pub mod demo;
pub mod docs_command;
pub mod etcd_cluster;
pub mod manpage;
pub mod memory_hog;
pub mod node;
pub mod run_command;
pub mod status_command;
pub mod swap_command;
pub mod torture;

// What the commands are built of, under the paths the binary and the tests have always used:
// the front ends' commands (their crates' `cli` modules), the shared front-end foundation, the
// local-cluster kit and the benchmarks (for the `remem bench` dispatch only).
pub use remem_fs::cli as fs_command;
pub use remem_kv::cli as kv_command;
pub use remem_nbd::cli as nbd_command;
pub use remem_sim::cli as sim_command;

pub use remem_bench::{
    apps_bench, bench, bench_floor, codec_bench, kv_bench, kv_ha_bench, plot, regen_bench,
};
pub use remem_frontend::{client_report, cluster_watch, code_args, metrics, placement_arg, transport_arg};
pub use remem_local::{faults, host_memory, launcher, pattern, ports, stats, units};

/// An error and its causes on one line, each cause once: a cause whose text its parent already
/// shows (thiserror messages often include their source) is not repeated.
pub fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_prints_each_cause_once() {
        let inner =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let error = anyhow::Error::new(inner)
            .context("node 127.0.0.1:1: Connection refused (os error 111)")
            .context("connecting");
        assert_eq!(
            super::error_text(&error),
            "connecting: node 127.0.0.1:1: Connection refused (os error 111)"
        );
    }
}
