//! Human sizes and counts on the command line. Sizes: `4096`, `64KiB`, `1.5GiB`, `2G`: K, M, G,
//! T and KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB are powers of 1000 (SI), as
//! `--help` says. Counts and sizes that must not be zero have their own parsers, so a 0 is
//! refused with a clear error instead of dividing by zero later.

/// Parses a byte count: a number (decimals allowed with a suffix, e.g. `1.5GiB`) and an
/// optional suffix (K/KiB/M/MiB/G/GiB/T/TiB: powers of 1024; KB/MB/GB/TB: powers of 1000; `B`
/// alone is bytes; case does not matter). The result must be a whole number of bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let number_end = trimmed.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(number_end);
    if number.is_empty()
        || number.starts_with('.')
        || number.ends_with('.')
        || number.matches('.').count() > 1
    {
        return Err(format!("{text:?} is not a size: expected a number such as 4096, 64MiB or 1.5GiB"));
    }
    let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown size suffix {other:?} (KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB powers of 1000)"
            ))
        }
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let whole: u64 = whole.parse().map_err(|_| format!("{text:?}: number too large"))?;
    let mut bytes = whole.checked_mul(multiplier).ok_or_else(|| format!("{text:?} overflows 64 bits"))?;
    if !fraction.is_empty() {
        // Exact decimal arithmetic: fraction digits times the multiplier over 10^digits.
        let digits = fraction.len().min(18) as u32;
        let numerator: u128 =
            fraction[..digits as usize].parse::<u128>().map_err(|_| format!("{text:?}: bad fraction"))?
                * u128::from(multiplier);
        let denominator = 10u128.pow(digits);
        if !numerator.is_multiple_of(denominator) {
            return Err(format!("{text:?} is not a whole number of bytes"));
        }
        let extra =
            u64::try_from(numerator / denominator).map_err(|_| format!("{text:?} overflows 64 bits"))?;
        bytes = bytes.checked_add(extra).ok_or_else(|| format!("{text:?} overflows 64 bits"))?;
    }
    Ok(bytes)
}

/// A size that must be more than zero bytes.
pub fn parse_positive_bytes(text: &str) -> Result<u64, String> {
    match parse_bytes(text)? {
        0 => Err(format!("{text:?}: must be more than 0 bytes")),
        bytes => Ok(bytes),
    }
}

/// A count that must be at least 1 (nodes, connections, queue depth, ops).
pub fn parse_count(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(count) => Ok(count),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

/// A number of milliseconds that must be at least 1.
pub fn parse_positive_ms(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1 millisecond".to_string()),
        Ok(ms) => Ok(ms),
        Err(_) => Err(format!("{text:?} is not a whole number of milliseconds")),
    }
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

/// Formats a byte count with the largest binary unit that keeps it readable (the client's, so
/// its errors and every command's print sizes alike).
pub use remem_client::format_bytes;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert!(parse_bytes("1.0000000001KiB").is_err());
        assert!(parse_bytes("1.5").is_err());
        assert!(parse_bytes(".5G").is_err());
        assert!(parse_bytes("99999999999TiB").is_err());
        assert_eq!(parse_positive_bytes("0").unwrap_err(), "\"0\": must be more than 0 bytes");
        assert!(parse_count("0").is_err() && parse_count("-1").is_err() && parse_count("3") == Ok(3));
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
