//! Human sizes on the command line: `4096`, `64KiB`, `64MiB`, `1GiB`, `2G` (powers of 1024).

/// Parses a byte count with an optional binary suffix (K, KiB, M, MiB, G, GiB, T, TiB; case
/// does not matter; `B` alone is bytes).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(digits_end);
    if number.is_empty() {
        return Err(format!("{text:?} is not a size: expected a number such as 4096, 64MiB or 1GiB"));
    }
    let value: u64 = number.parse().map_err(|_| format!("{text:?}: number too large"))?;
    let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("{text:?}: unknown size suffix {other:?} (use KiB, MiB, GiB or TiB)")),
    };
    value.checked_mul(multiplier).ok_or_else(|| format!("{text:?} overflows 64 bits"))
}

/// Parses a duration: a number with `ms`, `s` or `m` (e.g. `200ms`, `1s`); a bare number is
/// seconds.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let trimmed = text.trim();
    let digits_end = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(digits_end);
    if number.is_empty() {
        return Err(format!("{text:?} is not a duration: expected e.g. 200ms or 1s"));
    }
    let value: u64 = number.parse().map_err(|_| format!("{text:?}: number too large"))?;
    let milliseconds = match suffix.trim() {
        "ms" => Some(value),
        "" | "s" => value.checked_mul(1000),
        "m" | "min" => value.checked_mul(60_000),
        other => return Err(format!("{text:?}: unknown duration unit {other:?} (use ms, s or m)")),
    };
    milliseconds.map(std::time::Duration::from_millis).ok_or_else(|| format!("{text:?} is too long"))
}

/// Formats a byte count with the largest binary unit that keeps it readable.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size {
            return format!("{:.2} {name}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert_eq!(parse_bytes(" 2 GiB "), Ok(2 << 30));
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("12XB").is_err());
        assert!(parse_bytes("99999999999TiB").is_err());
    }

    #[test]
    fn parses_durations() {
        use std::time::Duration;
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("1h").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
        assert!(parse_duration("18446744073709551615s").is_err());
    }
}
