//! What /proc says of a process an earlier run started: whether a recorded PID is still a
//! `remem` process of a given kind (not exited, not recycled for something else). Used for the
//! leftovers of runs that could not clean up: a `remem up` that was SIGKILLed (its cluster
//! file), a `remem swap on` daemon, a `remem run`.

/// Whether `pid` is a running `remem SUBCOMMAND` process (not a recycled PID of something else,
/// and not a zombie), from /proc.
pub fn is_remem(pid: u32, subcommand: &str) -> bool {
    let Ok(command_line) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let words: Vec<&[u8]> = command_line.split(|&byte| byte == 0).collect();
    words.len() > 1 && words[0].ends_with(b"remem") && words[1] == subcommand.as_bytes() && !is_zombie(pid)
}

/// Whether `pid` has exited and waits to be reaped.
pub fn is_zombie(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name in parentheses.
    status.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'))
}
