//! Where a swap-in's time goes below the loop device: what the `remem fs` daemon under remem
//! swap measures itself (`remem swap on --metrics`, the daemon's Prometheus metrics), beside the
//! loop device's own counters. Per run, the deltas of:
//!
//! - `remem_fs_op_seconds{op="read"|"write"}`: a FUSE request from its arrival in the daemon to
//!   its answer (the daemon's share: FUSE handling and the page ops);
//! - `remem_fs_page_op_seconds{op="read"|"write"}`: a page op in the client from its start to
//!   its completion (the engine and the nodes).
//!
//! The loop device's mean time per request minus the daemon's mean time per FUSE request is
//! what the kernel spends around it: the loop worker, the FUSE queue and the two wake-ups
//! between the kernel and the daemon.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::Serialize;

/// Counters of the daemon at one moment (sums in seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DaemonStat {
    pub fuse_reads: f64,
    pub fuse_read_seconds: f64,
    pub fuse_writes: f64,
    pub fuse_write_seconds: f64,
    pub page_reads: f64,
    pub page_read_seconds: f64,
    pub page_writes: f64,
    pub page_write_seconds: f64,
}

impl DaemonStat {
    /// Reads the counters from an exposition text; None when one is missing.
    pub fn parse(text: &str) -> Option<DaemonStat> {
        let value = |series: &str| -> Option<f64> {
            text.lines()
                .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
        };
        Some(DaemonStat {
            fuse_reads: value("remem_fs_op_seconds_count{op=\"read\"}")?,
            fuse_read_seconds: value("remem_fs_op_seconds_sum{op=\"read\"}")?,
            fuse_writes: value("remem_fs_op_seconds_count{op=\"write\"}")?,
            fuse_write_seconds: value("remem_fs_op_seconds_sum{op=\"write\"}")?,
            page_reads: value("remem_fs_page_op_seconds_count{op=\"read\"}")?,
            page_read_seconds: value("remem_fs_page_op_seconds_sum{op=\"read\"}")?,
            page_writes: value("remem_fs_page_op_seconds_count{op=\"write\"}")?,
            page_write_seconds: value("remem_fs_page_op_seconds_sum{op=\"write\"}")?,
        })
    }

    /// Scrapes the daemon's metrics at `address` (one HTTP/1.0 GET, bounded by 2 s).
    pub fn scrape(address: SocketAddr) -> Option<DaemonStat> {
        let timeout = Duration::from_secs(2);
        let mut stream = TcpStream::connect_timeout(&address, timeout).ok()?;
        stream.set_read_timeout(Some(timeout)).ok()?;
        stream.set_write_timeout(Some(timeout)).ok()?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut response = Vec::new();
        // The exposition of one file system is a few KiB; a bound keeps a stranger's port from
        // feeding us without end.
        stream.take(4 << 20).read_to_end(&mut response).ok()?;
        DaemonStat::parse(&String::from_utf8_lossy(&response))
    }

    pub fn since(&self, earlier: &DaemonStat) -> DaemonStat {
        let delta = |now: f64, then: f64| (now - then).max(0.0);
        DaemonStat {
            fuse_reads: delta(self.fuse_reads, earlier.fuse_reads),
            fuse_read_seconds: delta(self.fuse_read_seconds, earlier.fuse_read_seconds),
            fuse_writes: delta(self.fuse_writes, earlier.fuse_writes),
            fuse_write_seconds: delta(self.fuse_write_seconds, earlier.fuse_write_seconds),
            page_reads: delta(self.page_reads, earlier.page_reads),
            page_read_seconds: delta(self.page_read_seconds, earlier.page_read_seconds),
            page_writes: delta(self.page_writes, earlier.page_writes),
            page_write_seconds: delta(self.page_write_seconds, earlier.page_write_seconds),
        }
    }
}

/// One run's split of a swap request's time, in milliseconds per request (or per page op).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FaultPath {
    /// A FUSE read in the daemon, mean.
    pub fuse_read_ms: Option<f64>,
    /// A page read in the client (engine and nodes), mean.
    pub page_read_ms: Option<f64>,
    /// Page reads per FUSE read.
    pub pages_per_fuse_read: Option<f64>,
    pub fuse_write_ms: Option<f64>,
    pub page_write_ms: Option<f64>,
    pub pages_per_fuse_write: Option<f64>,
}

impl FaultPath {
    pub fn from_delta(delta: &DaemonStat) -> FaultPath {
        let per = |sum: f64, count: f64| (count > 0.0).then(|| sum / count);
        FaultPath {
            fuse_read_ms: per(delta.fuse_read_seconds * 1000.0, delta.fuse_reads),
            page_read_ms: per(delta.page_read_seconds * 1000.0, delta.page_reads),
            pages_per_fuse_read: per(delta.page_reads, delta.fuse_reads),
            fuse_write_ms: per(delta.fuse_write_seconds * 1000.0, delta.fuse_writes),
            page_write_ms: per(delta.page_write_seconds * 1000.0, delta.page_writes),
            pages_per_fuse_write: per(delta.page_writes, delta.fuse_writes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "HTTP/1.0 200 OK\r\n\r\n\
        # TYPE remem_fs_op_seconds histogram\n\
        remem_fs_op_seconds_sum{op=\"read\"} 2.5\n\
        remem_fs_op_seconds_count{op=\"read\"} 1000\n\
        remem_fs_op_seconds_sum{op=\"write\"} 4\n\
        remem_fs_op_seconds_count{op=\"write\"} 500\n\
        remem_fs_op_seconds_count{op=\"fsync\"} 0\n\
        remem_fs_page_op_seconds_sum{op=\"read\"} 1.2\n\
        remem_fs_page_op_seconds_count{op=\"read\"} 1200\n\
        remem_fs_page_op_seconds_sum{op=\"write\"} 3\n\
        remem_fs_page_op_seconds_count{op=\"write\"} 1000\n";

    #[test]
    fn the_daemon_split_comes_from_the_exposition_and_missing_series_are_refused() {
        let now = DaemonStat::parse(TEXT).expect("every series is there");
        let path = FaultPath::from_delta(&now.since(&DaemonStat::default()));
        assert_eq!(path.fuse_read_ms, Some(2.5));
        assert_eq!(path.page_read_ms, Some(1.0));
        assert_eq!(path.pages_per_fuse_read, Some(1.2));
        assert_eq!(path.fuse_write_ms, Some(8.0));
        assert_eq!(path.page_write_ms, Some(3.0));
        assert_eq!(path.pages_per_fuse_write, Some(2.0));
        assert_eq!(FaultPath::from_delta(&now.since(&now)).fuse_read_ms, None);
        assert!(DaemonStat::parse(&TEXT.replace("op_seconds_sum{op=\"write\"} 4", "")).is_none());
        assert!(DaemonStat::parse("remem_fs_op_seconds_sum{op=\"read\"} x\n").is_none());
    }
}
