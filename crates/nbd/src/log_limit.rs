//! Rate limits for log lines that a peer can cause at will.
//!
//! A client can send requests that fail, or connections that fail the handshake, as fast as it
//! likes, and every one would otherwise write a few hundred bytes of log: a flood fills the disk. A
//! [`LogLimit`] lets at most `max_lines` lines of one kind through per `interval`; the first line
//! of the next interval that has any is preceded by one summary (`... and 1234 more in the last
//! 10 s`). A kind that goes quiet has its summary written when it speaks again (there is no
//! timer thread), so the count is never lost, only late.
//!
//! The same small type lives in remem-node (`log_limit.rs`): the two crates share no crate that
//! this belongs in (remem-proto is the wire format and does no logging; remem-nbd must not
//! depend on it), and 60 lines are cheaper to keep twice than a utility crate.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// NBD requests answered with an error (a node lost, a request out of range, ...).
pub static REQUEST_FAILURES: LogLimit = LogLimit::new("failed NBD requests", 10, Duration::from_secs(10));
/// Connections that come, fail their handshake or end with an error: anyone who can reach the
/// socket can cause these lines.
pub static CONNECTION_EVENTS: LogLimit = LogLimit::new("NBD connection events", 20, Duration::from_secs(10));

pub struct LogLimit {
    kind: &'static str,
    max_lines: u32,
    interval: Duration,
    window: Mutex<Window>,
}

struct Window {
    started: Option<Instant>,
    lines: u32,
    suppressed: u64,
}

impl LogLimit {
    pub const fn new(kind: &'static str, max_lines: u32, interval: Duration) -> LogLimit {
        LogLimit {
            kind,
            max_lines,
            interval,
            window: Mutex::new(Window { started: None, lines: 0, suppressed: 0 }),
        }
    }

    /// Whether the caller may write its line now. Counts the line as suppressed if not, and
    /// writes the summary of the last interval first when a new one begins.
    pub fn allow(&self) -> bool {
        let now = Instant::now();
        let mut window = self.window.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let expired = window.started.is_none_or(|started| now.duration_since(started) >= self.interval);
        if expired {
            if window.suppressed > 0 {
                tracing::warn!(
                    kind = self.kind,
                    suppressed = window.suppressed,
                    "... and {} more in the last {} s",
                    window.suppressed,
                    self.interval.as_secs()
                );
            }
            *window = Window { started: Some(now), lines: 0, suppressed: 0 };
        }
        if window.lines < self.max_lines {
            window.lines += 1;
            true
        } else {
            window.suppressed += 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_lines_per_interval_then_a_new_window() {
        let limit = LogLimit::new("test", 3, Duration::from_millis(50));
        let allowed = (0..100).filter(|_| limit.allow()).count();
        assert_eq!(allowed, 3);
        std::thread::sleep(Duration::from_millis(60));
        assert!(limit.allow(), "a new interval lets lines through again");
        assert_eq!(limit.window.lock().unwrap().suppressed, 0, "the summary was written");
    }
}
