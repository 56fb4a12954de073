//! The wall clock in unix seconds: expiry, hotness windows and `stats` time read it. One
//! function, at the bottom of the crate, so the engine and the protocol layer both name it
//! without naming each other.

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_secs())
        .unwrap_or(0)
}
