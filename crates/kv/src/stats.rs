//! Counters for `stats`, as memcached names them where memcached has them, and remem's own
//! (`remem_*`): degraded and lost reads, transitions and their bytes, bytes per scheme.

use crate::scheme::Scheme;

#[derive(Debug, Default)]
pub struct Stats {
    pub cmd_get: u64,
    pub cmd_set: u64,
    pub cmd_flush: u64,
    pub cmd_touch: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub get_expired: u64,
    pub delete_hits: u64,
    pub delete_misses: u64,
    pub incr_hits: u64,
    pub incr_misses: u64,
    pub decr_hits: u64,
    pub decr_misses: u64,
    pub cas_hits: u64,
    pub cas_misses: u64,
    pub cas_badval: u64,
    pub touch_hits: u64,
    pub touch_misses: u64,
    pub total_items: u64,
    pub evictions: u64,
    pub expired_unfetched: u64,
    pub curr_connections: u64,
    pub total_connections: u64,
    pub rejected_connections: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Of `bytes_written`, those the reply writers wrote (`--threads` above 1).
    pub writer_bytes_written: u64,
    /// The server's threads (`--threads`): the event loop and its reply writers.
    pub threads: u64,
    /// TCP connections speak TLS (`--enable-ssl`; `stats settings`' `ssl_enabled`).
    pub ssl_enabled: bool,
    /// Reads that decoded or fell back from the EOR main copy to the data splits.
    pub degraded_reads: u64,
    /// Values that could not be read back (more failures than the scheme survives).
    pub lost_reads: u64,
    /// EOR pages whose lost half was written back after a read.
    pub repairs: u64,
    pub failed_writes: u64,
    /// Chunk pages a set could not read to fill a free chunk: left untouched, the set's tail
    /// went to another page.
    pub unreadable_chunk_pages: u64,
    /// EOR pages written whole (data and parities) because a data split's node was down.
    pub eor_whole_page_writes: u64,
    /// EOR main-copy writes that failed while the value's data splits were written: the value
    /// is stored, and read from its data splits until its main copy is written again.
    pub eor_main_copy_misses: u64,
    /// EOR values read by the scrub of main copies lost or stale since a failure (each read
    /// wrote its main copy back).
    pub scrub_reads: u64,
    /// Request latency by kind (`remem_kv_request_seconds`).
    pub latency: crate::latency::Latencies,
    /// Item records written to the backup region (docs/KV.md "Restarts").
    pub backup_records_written: u64,
    /// Records the backup region could not take (full): those items would not survive a restart.
    pub backup_failures: u64,
    /// Restored values whose bytes did not match their record's checksum (dropped, not served).
    pub restored_mismatches: u64,
    /// Gets answered from a write in flight (data bypassing) and gets that shared a fetch.
    pub bypassed_gets: u64,
    pub shared_fetches: u64,
    pub bytes_read_remote: u64,
    pub bytes_written_remote: u64,
    pub stores_by_scheme: [u64; 5],
    /// Expired items whose memory a store took, by size class (`crate::size_class`; index 0 is
    /// class 1): memcached's `items:N:reclaimed`.
    pub reclaimed_by_class: Vec<u64>,
    /// Items evicted by the LRU, by size class: memcached's `items:N:evicted`.
    pub evicted_by_class: Vec<u64>,
    /// memcached's per-prefix counters (`stats detail on|off|dump`).
    pub prefixes: PrefixStats,
    pub transitions: u64,
    pub transitions_by_pair: [[u64; 5]; 5],
    pub transition_bytes_read: u64,
    pub transition_bytes_written: u64,
}

impl Stats {
    /// Counts an item of `item_bytes` in `counters` by its size class.
    pub fn count_in_class(counters: &mut Vec<u64>, item_bytes: u64) {
        if counters.is_empty() {
            counters.resize(crate::size_class::count(), 0);
        }
        counters[crate::size_class::of(item_bytes) - 1] += 1;
    }

    pub fn count_store(&mut self, scheme: Scheme, _bytes: usize) {
        self.stores_by_scheme[scheme.index()] += 1;
        self.total_items += 1;
    }

    pub fn count_transition(&mut self, from: Scheme, to: Scheme, read: u64, written: u64) {
        if from != to {
            self.transitions += 1;
            self.transitions_by_pair[from.index()][to.index()] += 1;
        }
        self.transition_bytes_read += read;
        self.transition_bytes_written += written;
    }
}

/// What a prefix's counters count (memcached's `stats detail`).
#[derive(Clone, Copy, Debug)]
pub enum PrefixEvent {
    Get { hit: bool },
    Set,
    Delete,
}

/// memcached's per-prefix statistics: the keys' part before the first `:` (a key without one
/// is not counted), their gets, hits, sets and deletes, while `stats detail on`. Bounded: at
/// most [`MAX_PREFIXES`] prefixes are counted (memcached's table grows without bound; keys are
/// the client's, so here a client cannot grow the server's memory through them).
#[derive(Debug, Default)]
pub struct PrefixStats {
    pub enabled: bool,
    counts: std::collections::HashMap<Box<[u8]>, [u64; 4]>,
}

/// The most prefixes [`PrefixStats`] counts; later new prefixes are not counted.
pub const MAX_PREFIXES: usize = 4096;
const PREFIX_DELIMITER: u8 = b':';

impl PrefixStats {
    /// Counts `event` for `key`'s prefix, when collection is on.
    pub fn record(&mut self, key: &[u8], event: PrefixEvent) {
        if !self.enabled {
            return;
        }
        let Some(end) = key.iter().position(|&byte| byte == PREFIX_DELIMITER) else { return };
        let prefix = &key[..end];
        if !self.counts.contains_key(prefix) && self.counts.len() >= MAX_PREFIXES {
            return;
        }
        let counts = self.counts.entry(prefix.into()).or_default();
        match event {
            PrefixEvent::Get { hit } => {
                counts[0] += 1;
                counts[1] += u64::from(hit);
            }
            PrefixEvent::Set => counts[2] += 1,
            PrefixEvent::Delete => counts[3] += 1,
        }
    }

    /// Forgets every prefix (`stats reset`).
    pub fn clear(&mut self) {
        self.counts.clear();
    }

    /// memcached's dump: `PREFIX <prefix> get <n> hit <n> set <n> del <n>` per prefix (sorted
    /// here), without the `END`.
    pub fn dump(&self, out: &mut Vec<u8>) {
        let mut prefixes: Vec<_> = self.counts.iter().collect();
        prefixes.sort_unstable_by(|left, right| left.0.cmp(right.0));
        for (prefix, [gets, hits, sets, deletes]) in prefixes {
            out.extend_from_slice(b"PREFIX ");
            out.extend_from_slice(prefix);
            out.extend_from_slice(format!(" get {gets} hit {hits} set {sets} del {deletes}\r\n").as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_count_as_memcacheds_stats_detail_and_stay_bounded() {
        let mut prefixes = PrefixStats::default();
        prefixes.record(b"foo:1", PrefixEvent::Set);
        prefixes.enabled = true;
        prefixes.record(b"foo:123", PrefixEvent::Set);
        prefixes.record(b"foo:123", PrefixEvent::Get { hit: true });
        prefixes.record(b"foo:124", PrefixEvent::Get { hit: false });
        prefixes.record(b"foo:125", PrefixEvent::Delete);
        prefixes.record(b"nodelimiter", PrefixEvent::Set);
        prefixes.record(b":empty", PrefixEvent::Set);
        let mut out = Vec::new();
        prefixes.dump(&mut out);
        assert_eq!(out, b"PREFIX  get 0 hit 0 set 1 del 0\r\nPREFIX foo get 2 hit 1 set 1 del 1\r\n");
        for index in 0..2 * MAX_PREFIXES {
            prefixes.record(format!("p{index}:k").as_bytes(), PrefixEvent::Set);
        }
        assert_eq!(prefixes.counts.len(), MAX_PREFIXES);
        prefixes.clear();
        let mut out = Vec::new();
        prefixes.dump(&mut out);
        assert!(out.is_empty());
    }
}
