//! The `remem` command line: node daemon, local cluster, demo and benchmarks.
//!
//! The binary (`main.rs`) only parses arguments; each command lives in its own module so the
//! tests can drive the same code.

pub mod completions;
pub mod config_file;
pub mod demo;
pub mod etcd_cluster;
pub mod fs_command;
pub mod fs_metrics;
pub mod kv_command;
pub mod kv_standby;
pub mod kv_state;
pub mod manpage;
pub mod memory_hog;
pub mod nbd_command;
pub mod nbd_metrics;
pub mod node;
pub mod run_command;
pub mod sim_command;
pub(crate) mod sim_plot;
pub mod status_command;
pub mod swap_command;
pub mod torture;

// The local-cluster kit, under the paths the commands and tests have always used.
pub use remem_bench::{
    apps_bench, bench, bench_floor, codec_bench, kv_bench, kv_ha_bench, plot, regen_bench,
};
pub use remem_frontend::{client_report, cluster_watch, code_args, metrics, placement_arg, transport_arg};
pub use remem_local::{faults, host_memory, launcher, pattern, stats, units};

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
