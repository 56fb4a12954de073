//! `stats`, `stats settings`, `stats items`, `stats slabs`, and remem's `stats schemes`: memcached's
//! names where memcached has the number, `remem_*` for remem's own.

use remem_memcache::response;

use remem_client::engine::Membership;

use crate::cache::Cache;
use crate::page_client::PageClient;
use crate::scheme::Scheme;
use crate::space::{RegionKind, PAGE_BYTES};

/// Items and bytes of values per scheme, from the index.
pub fn scheme_totals<P: PageClient>(cache: &Cache<P>) -> [(u64, u64); 5] {
    let mut totals = [(0u64, 0u64); 5];
    for id in cache.index().ids() {
        let entry = cache.index().entry(id);
        let scheme = cache.index().location(entry.location).scheme;
        totals[scheme.index()].0 += 1;
        totals[scheme.index()].1 += entry.value_bytes as u64;
    }
    totals
}

/// Node bytes the values of each scheme take: their pages and chunks (a chunk counts its
/// class size) times the scheme's overhead. EOR's reserved parity slots are not counted.
pub fn scheme_node_bytes<P: PageClient>(cache: &Cache<P>) -> [f64; 5] {
    let mut bytes = [0f64; 5];
    let ec = cache.config().ec;
    for id in cache.index().ids() {
        let location = cache.index().location(cache.index().entry(id).location);
        let held = location.extent.pages.len() * PAGE_BYTES
            + location.extent.tail.map(|chunk| crate::space::class_bytes(chunk.class)).unwrap_or(0);
        bytes[location.scheme.index()] += held as f64 * location.scheme.ideal_overhead(ec);
    }
    bytes
}

pub fn stats<P: PageClient>(cache: &mut Cache<P>, group: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    let group = group.map(|group| String::from_utf8_lossy(group).trim().to_ascii_lowercase());
    let words: Vec<&str> =
        group.as_deref().unwrap_or("").split(' ').filter(|word| !word.is_empty()).collect();
    match words.as_slice() {
        ["detail", "on"] | ["detail", "off"] => {
            cache.stats_mut().prefixes.enabled = words[1] == "on";
            return b"OK\r\n".to_vec();
        }
        ["detail", "dump"] => {
            cache.stats().prefixes.dump(&mut out);
            response::end(&mut out);
            return out;
        }
        ["detail", ..] => return b"CLIENT_ERROR usage: stats detail on|off|dump\r\n".to_vec(),
        ["reset"] => {
            // The per-prefix counters only: the others feed Prometheus counters (`--metrics`),
            // which must never go back (docs/KV.md "Conformance").
            cache.stats_mut().prefixes.clear();
            return b"RESET\r\n".to_vec();
        }
        _ => {}
    }
    match group.as_deref() {
        None | Some("") => general(cache, &mut out),
        Some("settings") => settings(cache, &mut out),
        Some("items") => items(cache, &mut out),
        Some("slabs") => slabs(cache, &mut out),
        Some("schemes") => schemes(cache, &mut out),
        Some(_) => {
            response::error(&mut out);
            return out;
        }
    }
    response::end(&mut out);
    out
}

fn general<P: PageClient>(cache: &mut Cache<P>, out: &mut Vec<u8>) {
    let (nodes, connected) = {
        let engine = cache.client_mut().engine();
        let members = engine.nodes().iter().filter(|node| node.membership == Membership::Member);
        members.fold((0, 0), |(all, up), node| (all + 1, up + usize::from(node.connected)))
    };
    let client = cache.client_mut();
    let (ranges_mapped, node_bytes_mapped) = (client.mapped_range_count(), client.mapped_node_bytes());
    let stats = cache.stats();
    let uptime = cache.uptime().as_secs();
    response::stat(out, "pid", std::process::id());
    response::stat(out, "uptime", uptime);
    response::stat(out, "time", cache.now_unix());
    response::stat(out, "version", VERSION);
    response::stat(out, "pointer_size", 64);
    response::stat(out, "curr_connections", stats.curr_connections);
    response::stat(out, "total_connections", stats.total_connections);
    response::stat(out, "rejected_connections", stats.rejected_connections);
    response::stat(out, "cmd_get", stats.cmd_get);
    response::stat(out, "cmd_set", stats.cmd_set);
    response::stat(out, "cmd_flush", stats.cmd_flush);
    response::stat(out, "cmd_touch", stats.cmd_touch);
    response::stat(out, "get_hits", stats.get_hits);
    response::stat(out, "get_misses", stats.get_misses);
    response::stat(out, "get_expired", stats.get_expired);
    response::stat(out, "delete_misses", stats.delete_misses);
    response::stat(out, "delete_hits", stats.delete_hits);
    response::stat(out, "incr_misses", stats.incr_misses);
    response::stat(out, "incr_hits", stats.incr_hits);
    response::stat(out, "decr_misses", stats.decr_misses);
    response::stat(out, "decr_hits", stats.decr_hits);
    response::stat(out, "cas_misses", stats.cas_misses);
    response::stat(out, "cas_hits", stats.cas_hits);
    response::stat(out, "cas_badval", stats.cas_badval);
    response::stat(out, "touch_hits", stats.touch_hits);
    response::stat(out, "touch_misses", stats.touch_misses);
    response::stat(out, "bytes_read", stats.bytes_read);
    response::stat(out, "bytes_written", stats.bytes_written);
    response::stat(out, "limit_maxbytes", cache.config().memory_limit_bytes);
    response::stat(out, "threads", stats.threads.max(1));
    response::stat(out, "bytes", cache.index().bytes_used());
    response::stat(out, "curr_items", cache.index().len());
    response::stat(out, "total_items", stats.total_items);
    response::stat(out, "expired_unfetched", stats.expired_unfetched);
    response::stat(out, "evictions", stats.evictions);
    response::stat(out, "remem_nodes", nodes);
    response::stat(out, "remem_nodes_connected", connected);
    response::stat(out, "remem_ranges_mapped", ranges_mapped);
    response::stat(out, "remem_node_bytes_mapped", node_bytes_mapped);
    response::stat(out, "remem_degraded_reads", stats.degraded_reads);
    response::stat(out, "remem_lost_reads", stats.lost_reads);
    response::stat(out, "remem_writer_bytes_written", stats.writer_bytes_written);
    response::stat(out, "remem_read_repairs", stats.repairs);
    response::stat(out, "remem_failed_writes", stats.failed_writes);
    response::stat(out, "remem_unreadable_chunk_pages", stats.unreadable_chunk_pages);
    response::stat(out, "remem_eor_whole_page_writes", stats.eor_whole_page_writes);
    response::stat(out, "remem_eor_main_copy_misses", stats.eor_main_copy_misses);
    response::stat(out, "remem_eor_scrub_reads", stats.scrub_reads);
    response::stat(out, "remem_backup_records_written", stats.backup_records_written);
    response::stat(out, "remem_backup_failures", stats.backup_failures);
    response::stat(out, "remem_restored_mismatches", stats.restored_mismatches);
    if let Some(mirror) = cache.state_mirror() {
        // `--etcd`: the backup region copied to the state region before replies leave.
        response::stat(out, "remem_state_copy_outs", mirror.barriers);
        response::stat(out, "remem_state_pages_written", mirror.pages_written);
    }
    response::stat(out, "remem_bypassed_gets", stats.bypassed_gets);
    response::stat(out, "remem_shared_fetches", stats.shared_fetches);
    response::stat(out, "remem_remote_bytes_read", stats.bytes_read_remote);
    response::stat(out, "remem_remote_bytes_written", stats.bytes_written_remote);
    response::stat(out, "remem_transitions", stats.transitions);
    response::stat(out, "remem_transition_bytes_read", stats.transition_bytes_read);
    response::stat(out, "remem_transition_bytes_written", stats.transition_bytes_written);
    response::stat(out, "remem_background_transitions", cache.background_transitions());
    response::stat(out, "remem_page_ops_in_flight", cache.io().busy());
    response::stat(out, "remem_page_ops_waiting", cache.io().waiting());
    response::stat(out, "remem_output_held_bytes", cache.budget().held_bytes());
    response::stat(out, "remem_output_held_bytes_peak", cache.budget().peak_held_bytes());
    response::stat(out, "remem_output_budget_waits", cache.budget().waits);
    let totals = scheme_totals(cache);
    for scheme in Scheme::ALL {
        let (items, bytes) = totals[scheme.index()];
        response::stat(out, &format!("remem_items_{}", scheme.stat_name()), items);
        response::stat(out, &format!("remem_bytes_{}", scheme.stat_name()), bytes);
    }
    for from in Scheme::ALL {
        for to in Scheme::ALL {
            let count = stats.transitions_by_pair[from.index()][to.index()];
            if count > 0 {
                response::stat(
                    out,
                    &format!("remem_transitions_{}_to_{}", from.stat_name(), to.stat_name()),
                    count,
                );
            }
        }
    }
}

fn settings<P: PageClient>(cache: &Cache<P>, out: &mut Vec<u8>) {
    let config = cache.config();
    response::stat(out, "maxbytes", config.memory_limit_bytes);
    response::stat(out, "item_size_max", config.max_item_bytes);
    response::stat(out, "num_threads", cache.stats().threads.max(1));
    response::stat(out, "evictions", "on");
    response::stat(out, "cas_enabled", "yes");
    response::stat(out, "ssl_enabled", if cache.stats().ssl_enabled { "yes" } else { "no" });
    response::stat(out, "remem_ec", config.ec.name());
    response::stat(out, "remem_bypass", if config.bypass { "yes" } else { "no" });
    response::stat(out, "remem_output_budget_bytes", cache.budget().total_limit_bytes());
    response::stat(out, "remem_connection_output_limit_bytes", cache.budget().connection_limit_bytes());
    let policy = &config.policy;
    let fixed = policy.fixed.map(|scheme| scheme.label(config.ec)).unwrap_or_else(|| "auto".into());
    response::stat(out, "remem_scheme", fixed);
    response::stat(out, "remem_small_below_bytes", policy.small_below_bytes);
    response::stat(out, "remem_small_scheme", policy.small_scheme.label(config.ec));
    response::stat(out, "remem_large_scheme", policy.large_scheme.label(config.ec));
    response::stat(out, "remem_cold_after_seconds", policy.cold_after.as_secs());
    response::stat(out, "remem_hot_reads", policy.hot_reads);
    response::stat(out, "remem_hot_window_seconds", policy.hot_window.as_secs());
    for (prefix, scheme) in &policy.prefixes {
        response::stat(
            out,
            &format!("remem_prefix:{}", String::from_utf8_lossy(prefix)),
            scheme.label(config.ec),
        );
    }
}

/// Items and their bytes (as counted against `--memory-limit`) per size class
/// (`crate::size_class`), index 0 being class 1, from the index.
fn class_totals<P: PageClient>(cache: &Cache<P>) -> Vec<(u64, u64)> {
    let mut totals = vec![(0u64, 0u64); crate::size_class::count()];
    for id in cache.index().ids() {
        let entry = cache.index().entry(id);
        let bytes = crate::index::item_bytes(entry.key.len(), entry.value_bytes);
        let total = &mut totals[crate::size_class::of(bytes) - 1];
        total.0 += 1;
        total.1 += bytes;
    }
    totals
}

/// A per-class event counter, 0 for a class that never counted.
fn class_count(counters: &[u64], class: usize) -> u64 {
    counters.get(class - 1).copied().unwrap_or(0)
}

/// memcached's `stats items`: per size class that holds items or counted an event, the items,
/// their bytes (`mem_requested`) and the reclaims and evictions it saw. remem keeps one LRU for
/// all classes, so the age is the oldest item's of the whole cache.
fn items<P: PageClient>(cache: &Cache<P>, out: &mut Vec<u8>) {
    let totals = class_totals(cache);
    let stats = cache.stats();
    let now = cache.now_unix();
    let oldest =
        cache.index().lru_tail().map_or(0, |id| now.saturating_sub(cache.index().entry(id).last_access));
    for class in 1..=crate::size_class::count() {
        let (items, bytes) = totals[class - 1];
        let reclaimed = class_count(&stats.reclaimed_by_class, class);
        let evicted = class_count(&stats.evicted_by_class, class);
        if items == 0 && reclaimed == 0 && evicted == 0 {
            continue;
        }
        response::stat(out, &format!("items:{class}:number"), items);
        response::stat(out, &format!("items:{class}:age"), oldest);
        response::stat(out, &format!("items:{class}:mem_requested"), bytes);
        response::stat(out, &format!("items:{class}:evicted"), evicted);
        response::stat(out, &format!("items:{class}:reclaimed"), reclaimed);
    }
}

/// memcached's `stats slabs`: per size class that holds items, its chunk size, the items
/// (`used_chunks`: one per item) and their bytes; `total_malloced` is the remote pages ever
/// handed out to values, before redundancy (memcached's: the slab pages it has taken; both only
/// grow, and stay put while freed memory is reused). docs/KV.md "Conformance".
fn slabs<P: PageClient>(cache: &Cache<P>, out: &mut Vec<u8>) {
    let totals = class_totals(cache);
    let mut active = 0;
    for (index, &(items, bytes)) in totals.iter().enumerate() {
        if items == 0 {
            continue;
        }
        active += 1;
        let class = index + 1;
        response::stat(out, &format!("{class}:chunk_size"), crate::size_class::sizes()[index]);
        response::stat(out, &format!("{class}:used_chunks"), items);
        response::stat(out, &format!("{class}:mem_requested"), bytes);
    }
    response::stat(out, "active_slabs", active);
    response::stat(out, "total_malloced", cache.space().pages_ever_used() * PAGE_BYTES as u64);
    response::stat(out, "remem_chunk_pages_cached", cache.chunks().cached_pages());
}

/// remem: memory per scheme, node bytes held against the scheme's ideal.
fn schemes<P: PageClient>(cache: &Cache<P>, out: &mut Vec<u8>) {
    let totals = scheme_totals(cache);
    let ec = cache.config().ec;
    for (kind, name) in [
        (RegionKind::None, "none"),
        (RegionKind::Rep2, "rep2"),
        (RegionKind::Rep3, "rep3"),
        (RegionKind::Ec, "ec"),
    ] {
        if cache.space().region_pages(kind).is_none() {
            continue;
        }
        let pages = cache.space().pages_in_use(kind);
        response::stat(out, &format!("{name}:pages_in_use"), pages);
        response::stat(out, &format!("{name}:page_bytes_in_use"), pages * PAGE_BYTES as u64);
    }
    let node_bytes = scheme_node_bytes(cache);
    for scheme in Scheme::ALL {
        let (items, bytes) = totals[scheme.index()];
        let name = scheme.stat_name();
        response::stat(out, &format!("{name}:items"), items);
        response::stat(out, &format!("{name}:value_bytes"), bytes);
        response::stat(out, &format!("{name}:node_bytes"), node_bytes[scheme.index()] as u64);
        let overhead = if bytes == 0 { 0.0 } else { node_bytes[scheme.index()] / bytes as f64 };
        response::stat(out, &format!("{name}:overhead"), format!("{overhead:.3}"));
        response::stat(out, &format!("{name}:ideal_overhead"), format!("{:.3}", scheme.ideal_overhead(ec)));
    }
}

/// The cache's counters in Prometheus text format (0.0.4), for `remem kv --metrics`.
/// A metric with one sample: its name after `remem_kv_`, its type, its help, and its value.
type Plain = (&'static str, &'static str, &'static str, fn(&mut Cache) -> u64);

/// The cache's metrics with one sample each, in the order `/metrics` shows them.
const PLAIN_METRICS: &[Plain] = &[
    ("gets_total", "counter", "Keys asked by get, gets, gat, gats and mg.", |cache| cache.stats().cmd_get),
    ("sets_total", "counter", "Storage commands.", |cache| cache.stats().cmd_set),
    ("get_hits_total", "counter", "Keys found.", |cache| cache.stats().get_hits),
    ("get_misses_total", "counter", "Keys not found.", |cache| cache.stats().get_misses),
    ("evictions_total", "counter", "Items evicted by the LRU.", |cache| cache.stats().evictions),
    (
        "degraded_reads_total",
        "counter",
        "Reads that decoded because a data split was missing (a node down, a corrupt or stale \
         split), or fell back from an EOR main copy to its data splits.",
        |cache| cache.stats().degraded_reads,
    ),
    (
        "lost_reads_total",
        "counter",
        "Values remote memory lost (more failures than their scheme survives).",
        |cache| cache.stats().lost_reads,
    ),
    ("failed_writes_total", "counter", "Writes remote memory refused.", |cache| cache.stats().failed_writes),
    (
        "unreadable_chunk_pages_total",
        "counter",
        "Chunk pages a set could not read to fill a free chunk (left as they were).",
        |cache| cache.stats().unreadable_chunk_pages,
    ),
    (
        "eor_whole_page_writes_total",
        "counter",
        "EOR pages written whole (data and parities) because a data split's node was down.",
        |cache| cache.stats().eor_whole_page_writes,
    ),
    (
        "eor_main_copy_misses_total",
        "counter",
        "EOR main-copy writes that failed while the data splits were written (read from them).",
        |cache| cache.stats().eor_main_copy_misses,
    ),
    (
        "eor_scrub_reads_total",
        "counter",
        "EOR values read by the scrub to write back main copies lost or stale since a failure.",
        |cache| cache.stats().scrub_reads,
    ),
    (
        "backup_records_written_total",
        "counter",
        "Item records written to the backup region (docs/KV.md Restarts).",
        |cache| cache.stats().backup_records_written,
    ),
    (
        "backup_failures_total",
        "counter",
        "Items the backup region could not record (full): answered with an error.",
        |cache| cache.stats().backup_failures,
    ),
    (
        "restored_mismatches_total",
        "counter",
        "Restored values whose bytes did not match their record's checksum (dropped).",
        |cache| cache.stats().restored_mismatches,
    ),
    ("backup_chunks_used", "gauge", "1 MiB chunks of the backup region in use.", |cache| {
        cache.backup().map_or(0, |backup| u64::from(backup.chunks_used().0))
    }),
    ("backup_chunks", "gauge", "1 MiB chunks of the backup region.", |cache| {
        cache.backup().map_or(0, |backup| u64::from(backup.chunks_used().1))
    }),
    ("read_repairs_total", "counter", "EOR halves written back after a read.", |cache| cache.stats().repairs),
    ("bypassed_gets_total", "counter", "Gets answered from a write in flight.", |cache| {
        cache.stats().bypassed_gets
    }),
    ("transitions_total", "counter", "Objects moved to another scheme.", |cache| cache.stats().transitions),
    ("remote_read_bytes_total", "counter", "Page bytes read from remote memory.", |cache| {
        cache.stats().bytes_read_remote
    }),
    ("remote_written_bytes_total", "counter", "Page bytes written to remote memory.", |cache| {
        cache.stats().bytes_written_remote
    }),
    ("connections", "gauge", "Client connections open.", |cache| cache.stats().curr_connections),
    (
        "output_held_bytes",
        "gauge",
        "Bytes held for replies: values fetched for gets, replies waiting, output not yet written.",
        |cache| cache.budget().held_bytes() as u64,
    ),
    (
        "output_budget_bytes",
        "gauge",
        "--output-budget: held bytes beyond which connections wait for their clients to read.",
        |cache| cache.budget().total_limit_bytes() as u64,
    ),
    (
        "output_budget_waits_total",
        "counter",
        "Times a connection's next value or request waited for the output budget.",
        |cache| cache.budget_mut().waits,
    ),
    ("items", "gauge", "Items in the cache.", |cache| cache.index().len() as u64),
    ("item_bytes", "gauge", "Bytes counted against --memory-limit.", |cache| cache.index().bytes_used()),
    ("memory_limit_bytes", "gauge", "--memory-limit.", |cache| cache.config().memory_limit_bytes),
];

/// The client's view of the cluster, after the per-scheme metrics.
const NODE_METRICS: &[Plain] = &[
    ("nodes", "gauge", "Memory nodes the cache's client knows.", |cache| member_nodes(cache).0),
    ("nodes_connected", "gauge", "Memory nodes connected now.", |cache| member_nodes(cache).1),
    (
        "ranges_mapped",
        "gauge",
        "Ranges of the cache's regions with slabs now (mapped as values need them).",
        |cache| cache.client_mut().client().mapped_range_count() as u64,
    ),
    ("node_bytes_mapped", "gauge", "Node memory the cache's slabs take now, with their metadata.", |cache| {
        cache.client_mut().client().mapped_node_bytes()
    }),
];

/// Member nodes the cache's client knows, and how many of them are connected.
fn member_nodes(cache: &mut Cache) -> (u64, u64) {
    let engine = cache.client_mut().client().engine();
    let members = engine.nodes().iter().filter(|node| node.membership == Membership::Member);
    members.fold((0u64, 0u64), |(all, up), node| (all + 1, up + u64::from(node.connected)))
}

pub fn prometheus(cache: &mut Cache) -> String {
    let mut out = remem_frontend::metrics::Exposition::default();
    for (name, kind, help, read) in PLAIN_METRICS {
        out.metric(&format!("remem_kv_{name}"), help, kind, read(cache) as f64);
    }
    let totals = scheme_totals(cache);
    let per_scheme = |pick: fn((u64, u64)) -> u64| -> Vec<(&'static str, f64)> {
        Scheme::ALL.iter().map(|scheme| (scheme.stat_name(), pick(totals[scheme.index()]) as f64)).collect()
    };
    let items = per_scheme(|(items, _)| items);
    out.labeled("remem_kv_scheme_items", "Items per redundancy scheme.", "gauge", "scheme", &items);
    let bytes = per_scheme(|(_, bytes)| bytes);
    out.labeled(
        "remem_kv_scheme_value_bytes",
        "Value bytes per redundancy scheme.",
        "gauge",
        "scheme",
        &bytes,
    );
    for (name, kind, help, read) in NODE_METRICS {
        out.metric(&format!("remem_kv_{name}"), help, kind, read(cache) as f64);
    }
    cache.stats().latency.render(&mut out);
    out.finish()
}

/// What `version` answers: memcached's major version (clients check it) and remem's.
pub const VERSION: &str = concat!("1.6.0-remem-", env!("CARGO_PKG_VERSION"));
