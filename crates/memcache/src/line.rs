//! Command-line framing, tokenizing and the number and key rules shared by text and meta commands.
//!
//! memcached's rules, kept here: a line ends at "\n" with an optional "\r" before it; tokens are
//! separated by one or more spaces (only spaces: a tab is part of a token); numbers are decimal
//! with an optional sign, nothing else in the token. Stricter than memcached, on purpose: a
//! number out of its type's range is rejected (memcached's `strtoul` silently truncates 33-bit
//! flags on 64-bit hosts), and so is a key with a control character (memcached stores it).

use crate::request::Key;

/// The outcome of looking for one command line at the start of the input.
pub(crate) enum Line<'a> {
    /// No "\n" yet, and the line so far is within the limit.
    Incomplete,
    /// The line is longer than the limit (with or without its "\n" in the input).
    TooLong,
    /// A line: its bytes without the terminator, and the offset just past the "\n".
    Complete { line: &'a [u8], next: usize },
}

/// Finds the first command line of `input`. Looks at most `max_line_bytes + 2` bytes ahead, so
/// the cost does not grow with a hostile unterminated input, and the verdict on a line does not
/// depend on how its bytes were split into reads.
pub(crate) fn split_line(input: &[u8], max_line_bytes: usize) -> Line<'_> {
    let window = input.len().min(max_line_bytes.saturating_add(2));
    let Some(newline) = input[..window].iter().position(|&byte| byte == b'\n') else {
        if window == input.len() && input.len() < max_line_bytes.saturating_add(2) {
            return Line::Incomplete;
        }
        return Line::TooLong;
    };
    let mut line = &input[..newline];
    if let [rest @ .., b'\r'] = line {
        line = rest;
    }
    if line.len() > max_line_bytes {
        return Line::TooLong;
    }
    Line::Complete { line, next: newline + 1 }
}

/// The space-separated tokens of a line (empty tokens skipped), as subslices of the line.
#[derive(Clone)]
pub(crate) struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    pub(crate) fn new(line: &'a [u8]) -> Self {
        Self { rest: line }
    }

    /// What is left after the tokens taken so far, without leading spaces: a subslice of the line.
    pub(crate) fn remainder(&self) -> &'a [u8] {
        let start = self.rest.iter().position(|&byte| byte != b' ').unwrap_or(self.rest.len());
        &self.rest[start..]
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.remainder();
        if rest.is_empty() {
            self.rest = rest;
            return None;
        }
        let end = rest.iter().position(|&byte| byte == b' ').unwrap_or(rest.len());
        self.rest = &rest[end..];
        Some(&rest[..end])
    }
}

/// Splits a line into at most `N` tokens; returns `None` when it has more.
pub(crate) fn at_most<const N: usize>(tokens: Tokens<'_>) -> Option<([&[u8]; N], usize)> {
    let mut found = [&[][..]; N];
    let mut count = 0;
    for token in tokens {
        if count == N {
            return None;
        }
        found[count] = token;
        count += 1;
    }
    Some((found, count))
}

/// A byte memcached's protocol forbids in keys and that remem also refuses in echoed tokens.
pub(crate) fn is_control(byte: u8) -> bool {
    byte < 0x21 || byte == 0x7f
}

/// Checks a text key token: 1..=`max_key_bytes` bytes, no control characters.
pub(crate) fn text_key(token: &[u8], max_key_bytes: usize) -> Option<Key<'_>> {
    if token.is_empty() || token.len() > max_key_bytes || token.iter().any(|&byte| is_control(byte)) {
        return None;
    }
    Some(Key::Borrowed(token))
}

/// The digits of an unsigned decimal with an optional `+`, as memcached's `strtoull` accepts.
fn unsigned_digits(token: &[u8]) -> Option<&[u8]> {
    let digits = token.strip_prefix(b"+").unwrap_or(token);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits)
}

/// Parses an unsigned decimal that fits a u64; no allocation, overflow is rejected.
pub(crate) fn parse_u64(token: &[u8]) -> Option<u64> {
    unsigned_digits(token)?
        .iter()
        .try_fold(0u64, |value, &digit| value.checked_mul(10)?.checked_add(u64::from(digit - b'0')))
}

/// Parses an unsigned decimal that fits a u32.
pub(crate) fn parse_u32(token: &[u8]) -> Option<u32> {
    parse_u64(token).and_then(|value| u32::try_from(value).ok())
}

/// Parses a signed decimal that fits memcached's 32-bit exptime, widened to i64.
pub(crate) fn parse_exptime(token: &[u8]) -> Option<i64> {
    let (negative, magnitude) = match token.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, token),
    };
    if negative && magnitude.first() == Some(&b'+') {
        return None;
    }
    let magnitude = i64::try_from(parse_u64(magnitude)?).ok()?;
    let value = if negative { -magnitude } else { magnitude };
    (i64::from(i32::MIN)..=i64::from(i32::MAX)).contains(&value).then_some(value)
}

/// Parses a data block length: memcached reads it as a 32-bit int and rejects negative values and
/// values above `i32::MAX - 2` (the length plus its "\r\n" must fit).
pub(crate) fn parse_data_length(token: &[u8]) -> Option<usize> {
    let value = parse_exptime(token)?;
    if !(0..=i64::from(i32::MAX) - 2).contains(&value) {
        return None;
    }
    usize::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_memcached_and_reject_overflow() {
        assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_u32(b"4294967296"), None);
        assert_eq!(parse_u32(b"+7"), Some(7));
        assert_eq!(parse_u32(b"-1"), None);
        assert_eq!(parse_u32(b""), None);
        assert_eq!(parse_u32(b"+"), None);
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_exptime(b"-2147483648"), Some(-2_147_483_648));
        assert_eq!(parse_exptime(b"2147483648"), None);
        assert_eq!(parse_exptime(b"-+5"), None);
        assert_eq!(parse_exptime(b"--5"), None);
        assert_eq!(parse_exptime(b"12a"), None);
        assert_eq!(parse_data_length(b"2147483645"), Some(2_147_483_645));
        assert_eq!(parse_data_length(b"2147483646"), None);
        assert_eq!(parse_data_length(b"-1"), None);
    }

    #[test]
    fn tokens_split_on_spaces_only() {
        let tokens: Vec<&[u8]> = Tokens::new(b"  get  a\tb  c ").collect();
        assert_eq!(tokens, vec![&b"get"[..], b"a\tb", b"c"]);
        let mut tokens = Tokens::new(b"stats  detail dump ");
        assert_eq!(tokens.next(), Some(&b"stats"[..]));
        assert_eq!(tokens.remainder(), b"detail dump ");
    }

    #[test]
    fn line_limit_does_not_depend_on_the_split() {
        assert!(matches!(split_line(b"abcd", 4), Line::Incomplete));
        assert!(matches!(split_line(b"abcd\r", 4), Line::Incomplete));
        assert!(matches!(split_line(b"abcd\r\n", 4), Line::Complete { line: b"abcd", next: 6 }));
        assert!(matches!(split_line(b"abcde", 4), Line::Incomplete));
        assert!(matches!(split_line(b"abcdef", 4), Line::TooLong));
        assert!(matches!(split_line(b"abcde\n", 4), Line::TooLong));
        assert!(matches!(split_line(b"\n", 4), Line::Complete { line: b"", next: 1 }));
    }
}
