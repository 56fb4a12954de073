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
