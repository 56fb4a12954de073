//! Host settings for a server that may back swap (docs/NBD.md, "Swap"): memory locked so the
//! server never waits on the swap device it serves, and an OOM score that makes the kernel
//! pick other victims first.

use std::io;

/// Locks every current and future page of this process in RAM (`mlockall(MCL_CURRENT |
/// MCL_FUTURE)`). Needs CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK.
pub fn lock_all_memory() -> io::Result<()> {
    // SAFETY: mlockall takes only flags and touches no memory of ours.
    let result = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets /proc/self/oom_score_adj (-1000 exempts the process from the OOM killer; lowering it
/// needs CAP_SYS_RESOURCE).
pub fn set_oom_score_adj(value: i32) -> io::Result<()> {
    if !(-1000..=1000).contains(&value) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "oom_score_adj is between -1000 and 1000"));
    }
    std::fs::write("/proc/self/oom_score_adj", value.to_string())
}
