//! memcached's exptime rule, as a pure function of the raw value and "now".
//!
//! 0 never expires; a negative value is already expired; up to 30 days (2,592,000 s) is relative
//! to now; a larger value is an absolute unix time, expired if not in the future.

/// The largest exptime taken as relative seconds (30 days); larger values are unix times.
pub const MAX_RELATIVE_EXPTIME_SECONDS: i64 = 60 * 60 * 24 * 30;

/// When an item stops being visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Expiry {
    /// Never expires (it may still be evicted).
    Never,
    /// Visible while the clock (unix seconds) is before this instant.
    At(u64),
    /// Already expired: a store with this exptime leaves nothing visible.
    Expired,
}

impl Expiry {
    /// Whether an item with this expiry is still visible at `now_unix`.
    pub fn is_live(self, now_unix: u64) -> bool {
        match self {
            Self::Never => true,
            Self::At(deadline) => now_unix < deadline,
            Self::Expired => false,
        }
    }

    /// The remaining TTL as memcached reports it (meta `t` flag, `me exp=`): -1 without expiry,
    /// else the whole seconds left (0 once past).
    pub fn ttl_seconds(self, now_unix: u64) -> i64 {
        match self {
            Self::Never => -1,
            Self::At(deadline) => i64::try_from(deadline.saturating_sub(now_unix)).unwrap_or(i64::MAX),
            Self::Expired => 0,
        }
    }
}

/// Turns a raw memcached exptime into a deadline, given the current unix time in seconds.
pub fn expiry_deadline(exptime: i64, now_unix: u64) -> Expiry {
    match exptime {
        0 => Expiry::Never,
        exptime if exptime < 0 => Expiry::Expired,
        relative @ 1..=MAX_RELATIVE_EXPTIME_SECONDS => {
            Expiry::At(now_unix.saturating_add(relative.unsigned_abs()))
        }
        absolute => {
            let absolute = absolute.unsigned_abs();
            if absolute <= now_unix {
                Expiry::Expired
            } else {
                Expiry::At(absolute)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000;

    #[test]
    fn zero_never_expires() {
        assert_eq!(expiry_deadline(0, NOW), Expiry::Never);
        assert!(Expiry::Never.is_live(u64::MAX));
        assert_eq!(Expiry::Never.ttl_seconds(NOW), -1);
    }

    #[test]
    fn negative_is_already_expired() {
        assert_eq!(expiry_deadline(-1, NOW), Expiry::Expired);
        assert_eq!(expiry_deadline(i64::MIN, NOW), Expiry::Expired);
    }

    #[test]
    fn up_to_thirty_days_is_relative() {
        assert_eq!(expiry_deadline(1, NOW), Expiry::At(NOW + 1));
        assert_eq!(expiry_deadline(2_592_000, NOW), Expiry::At(NOW + 2_592_000));
        assert_eq!(expiry_deadline(10, NOW).ttl_seconds(NOW + 3), 7);
        assert!(!expiry_deadline(10, NOW).is_live(NOW + 10));
    }

    #[test]
    fn beyond_thirty_days_is_absolute() {
        assert_eq!(expiry_deadline(2_592_001, NOW), Expiry::Expired);
        assert_eq!(expiry_deadline(1_700_000_000, NOW), Expiry::Expired);
        assert_eq!(expiry_deadline(1_700_000_100, NOW), Expiry::At(1_700_000_100));
        // Early clocks: a small absolute time is still absolute, never relative.
        assert_eq!(expiry_deadline(2_592_001, 0), Expiry::At(2_592_001));
    }
}
