//! Processes and mounts as the host sees them. Settings for a server that may back swap
//! (docs/NBD.md, "Swap"): memory locked so the server never waits on the swap device it serves,
//! and an OOM score that makes the kernel pick other victims first. And what /proc says of
//! earlier runs' leftovers: whether a PID is still a `remem` process of a given kind (from
//! remem-local, whose launcher asks it too), and what is mounted at a path.

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

pub use remem_frontend::process::{is_remem, is_zombie};

/// The file system type and source of the topmost mount at `mountpoint` (an absolute path),
/// from /proc/self/mountinfo (whose paths escape space, tab, newline and backslash).
pub fn mount_at(mountpoint: &std::path::Path) -> Option<(String, String)> {
    let mut escaped = String::new();
    for character in mountpoint.to_string_lossy().chars() {
        match character {
            ' ' => escaped.push_str("\\040"),
            '\t' => escaped.push_str("\\011"),
            '\n' => escaped.push_str("\\012"),
            '\\' => escaped.push_str("\\134"),
            other => escaped.push(other),
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER_OPTIONS
    mountinfo
        .lines()
        .filter(|line| line.split(' ').nth(4) == Some(escaped.as_str()))
        .filter_map(|line| {
            let mut fields = line.split(" - ").nth(1)?.split(' ');
            Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
        })
        .next_back()
}
