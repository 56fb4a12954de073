//! Host-memory guardrails of `remem node` and `remem up`: a capacity the host can never give is
//! refused before any node starts, instead of the kernel's OOM killer choosing a victim months
//! later when clients finally fill the node.
//!
//! Two bounds, both read once at startup:
//! - the host's memory: the memory limit of this process's cgroup (v2 or v1, or its nearest
//!   limited ancestor) if it has one, else MemTotal. No node may lend more than that.
//! - with no resource monitor (`--no-monitor`, as `remem up` starts its nodes) nothing keeps a
//!   headroom for the host's own applications, so the nodes together may lend at most 80% of
//!   what is available now (MemAvailable, or the cgroup's limit minus its usage if less).
//!
//! Every refusal gives the numbers and ends with "pass --force to start anyway". Where the host's
//! memory cannot be read (no /proc), nothing is checked: the guardrail is advice, not a
//! requirement for running.

use std::path::Path;

use crate::units::format_bytes;

/// Percent of the available memory nodes without a resource monitor may lend together.
pub const UNMONITORED_PERCENT_OF_AVAILABLE: u64 = 80;

/// What the host can give, read once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// The cgroup memory limit, or MemTotal: the most this process's cgroup can ever use.
    pub limit_bytes: u64,
    /// Free now: MemAvailable, or the cgroup's limit minus its usage if that is less.
    pub available_bytes: u64,
    /// Where `limit_bytes` comes from, for messages (`/proc/meminfo`, `cgroup v2 /sys/...`).
    pub source: String,
}

impl HostMemory {
    /// Reads this process's cgroup limit (if any) and /proc/meminfo; `None` if they cannot be
    /// read, in which case the caller checks nothing.
    pub fn read() -> Option<HostMemory> {
        let source = remem_node::MemorySource::detect(Path::new("/")).ok()?;
        let reading = source.read().ok()?;
        let mem_available = crate::launcher::host_available_bytes().unwrap_or(reading.free_bytes);
        let source = match source {
            remem_node::MemorySource::MemInfo { path } => format!("MemTotal of {}", path.display()),
            other => format!("the memory limit of {other}"),
        };
        Some(HostMemory {
            limit_bytes: reading.limit_bytes,
            available_bytes: reading.free_bytes.min(mem_available),
            source,
        })
    }

    /// What nodes without a resource monitor may lend together.
    pub fn unmonitored_budget_bytes(&self) -> u64 {
        self.available_bytes / 100 * UNMONITORED_PERCENT_OF_AVAILABLE
    }

    /// Checks that `total_bytes` of node capacity (`what` names it for the message, e.g.
    /// `--capacity 4.00 GiB`) fits this host: never above its memory, and when no resource
    /// monitor keeps a headroom (`monitored` false) never above 80% of what is available.
    ///
    /// Errors: a message with the numbers, ending with "pass --force to start anyway".
    pub fn check(&self, what: &str, total_bytes: u64, monitored: bool) -> Result<(), String> {
        if total_bytes > self.limit_bytes {
            return Err(format!(
                "{what} is more than this host can ever give: its memory is {} ({}); \
                 lower the capacity, or pass --force to start anyway",
                format_bytes(self.limit_bytes),
                self.source
            ));
        }
        if !monitored && total_bytes > self.unmonitored_budget_bytes() {
            return Err(format!(
                "{what} is more than {UNMONITORED_PERCENT_OF_AVAILABLE}% of the {} this host has \
                 available (of {}), and without a resource monitor (--no-monitor) nothing keeps \
                 memory for the host's own applications; lower the capacity, or pass --force to \
                 start anyway",
                format_bytes(self.available_bytes),
                format_bytes(self.limit_bytes)
            ));
        }
        Ok(())
    }

    /// The capacity `remem up` gives each of `nodes` nodes of `slab_size_bytes` slabs when not
    /// told: `preferred_bytes`, or less so that all of them fit the unmonitored budget, in
    /// whole slabs. `None` when not even one slab per node fits.
    pub fn default_capacity_bytes(
        &self,
        nodes: usize,
        slab_size_bytes: u64,
        preferred_bytes: u64,
    ) -> Option<u64> {
        assert!(nodes > 0 && slab_size_bytes > 0, "the argument parsers refuse zero");
        let share = self.unmonitored_budget_bytes() / nodes as u64;
        if share >= preferred_bytes {
            return Some(preferred_bytes);
        }
        let whole_slabs = share - share % slab_size_bytes;
        (whole_slabs >= slab_size_bytes).then_some(whole_slabs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn host(limit_gib: u64, available_gib: u64) -> HostMemory {
        HostMemory {
            limit_bytes: limit_gib * GIB,
            available_bytes: available_gib * GIB,
            source: "MemTotal of /proc/meminfo".into(),
        }
    }

    #[test]
    fn a_capacity_above_the_host_memory_is_refused_with_the_numbers() {
        let error = host(4, 3).check("--capacity 100.00 TiB", 100 << 40, true).unwrap_err();
        assert!(error.contains("4.00 GiB (MemTotal of /proc/meminfo)"), "{error}");
        assert!(error.ends_with("pass --force to start anyway"), "{error}");
        assert!(host(4, 3).check("--capacity 3.00 GiB", 3 * GIB, true).is_ok());
    }

    #[test]
    fn without_a_monitor_only_80_percent_of_available_memory_is_lent() {
        let small = host(4, 3);
        assert!(small.check("c", 2 * GIB, false).is_ok());
        let error = small.check("c", 3 * GIB, false).unwrap_err();
        assert!(error.contains("80% of the 3.00 GiB") && error.contains("--no-monitor"), "{error}");
        assert!(small.check("c", 3 * GIB, true).is_ok(), "a monitor keeps its own headroom");
    }

    #[test]
    fn up_defaults_shrink_to_fit_a_small_host_in_whole_slabs() {
        // 10 nodes on a host with 3 GiB available: 80% of it is 2.4 GiB, 245 MiB a node, so 3
        // slabs of 64 MiB.
        assert_eq!(host(4, 3).default_capacity_bytes(10, 64 << 20, 2 * GIB), Some(192 << 20));
        assert_eq!(host(32, 30).default_capacity_bytes(10, 64 << 20, 2 * GIB), Some(2 * GIB));
        assert_eq!(host(1, 1).default_capacity_bytes(100, 1 << 30, 2 * GIB), None);
    }
}
