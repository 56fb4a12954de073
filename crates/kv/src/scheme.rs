//! Redundancy schemes of one object and the policy that picks them.
//!
//! Every object has exactly one scheme: `none` (one copy, lost with its node), `rep(n)` (n
//! copies on n nodes), `EC(k,m)` (k data splits and m parities per page: survives m failures at
//! (k+m)/k memory), or `EOR(2,k)` (seed 003 §4.2: the main copy whole on the first parity node of
//! the page's EC(k,m) stripe and a redundant replica as the k data splits, exactly where EC(k,m)
//! puts them: survives one failure at 2x memory, and becomes EC(k,m) by writing only the m
//! parities). EOR here is EOR(2,k): one redundant replica; EOR(3,k) would add a second replica
//! rotated over the data nodes, which the page layout below does not have room for.
//!
//! The policy decides in this order: the client's hint (the meta `P`/`L` token), a key prefix
//! rule, the server's fixed `--scheme`, then size and hotness (docs/KV.md "Policy").

use std::fmt;
use std::time::Duration;

use remem_client::Shape;

/// The schemes a server offers; `Ec` and `Eor` use the server's one EC shape (k, m).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    None,
    Rep2,
    Rep3,
    Ec,
    Eor,
}

impl Scheme {
    pub const ALL: [Scheme; 5] = [Scheme::None, Scheme::Rep2, Scheme::Rep3, Scheme::Ec, Scheme::Eor];

    pub fn index(self) -> usize {
        self as usize
    }

    /// Parses `none`, `rep2`, `rep3`, `ec` or `ec<k>+<m>` (must be the server's shape), `eor`
    /// or `eor2`.
    pub fn parse(text: &[u8], ec: EcShape) -> Result<Scheme, SchemeError> {
        let text = std::str::from_utf8(text)
            .map_err(|_| SchemeError::Unknown(String::from_utf8_lossy(text).into()))?;
        let lower = text.to_ascii_lowercase();
        match lower.as_str() {
            "none" => return Ok(Scheme::None),
            "rep2" | "rep(2)" => return Ok(Scheme::Rep2),
            "rep3" | "rep(3)" => return Ok(Scheme::Rep3),
            "ec" => return Ok(Scheme::Ec),
            "eor" | "eor2" | "eor(2)" => return Ok(Scheme::Eor),
            _ => {}
        }
        if lower == ec.name() || lower == format!("ec({},{})", ec.data_splits, ec.parity_splits) {
            return Ok(Scheme::Ec);
        }
        if lower.starts_with("ec") {
            return Err(SchemeError::OtherShape { asked: text.to_string(), offered: ec.name() });
        }
        Err(SchemeError::Unknown(text.to_string()))
    }

    /// Node bytes per value byte when pages are full (the scheme's ideal).
    pub fn ideal_overhead(self, ec: EcShape) -> f64 {
        match self {
            Scheme::None => 1.0,
            Scheme::Rep2 => 2.0,
            Scheme::Rep3 => 3.0,
            Scheme::Ec => (ec.data_splits + ec.parity_splits) as f64 / ec.data_splits as f64,
            Scheme::Eor => 2.0,
        }
    }

    /// Node failures the scheme survives.
    pub fn tolerates(self, ec: EcShape) -> usize {
        match self {
            Scheme::None => 0,
            Scheme::Rep2 | Scheme::Eor => 1,
            Scheme::Rep3 => 2,
            Scheme::Ec => ec.parity_splits,
        }
    }

    pub fn label(self, ec: EcShape) -> String {
        match self {
            Scheme::None => "none".into(),
            Scheme::Rep2 => "rep2".into(),
            Scheme::Rep3 => "rep3".into(),
            Scheme::Ec => ec.name(),
            Scheme::Eor => "eor2".into(),
        }
    }

    /// The name used in `stats` keys.
    pub fn stat_name(self) -> &'static str {
        match self {
            Scheme::None => "none",
            Scheme::Rep2 => "rep2",
            Scheme::Rep3 => "rep3",
            Scheme::Ec => "ec",
            Scheme::Eor => "eor",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchemeError {
    #[error("unknown scheme {0:?} (none, rep2, rep3, ec, eor)")]
    Unknown(String),
    #[error("scheme {asked} is not offered: this server's EC shape is {offered}")]
    OtherShape { asked: String, offered: String },
}

/// The server's EC shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EcShape {
    pub data_splits: usize,
    pub parity_splits: usize,
}

impl EcShape {
    pub fn name(&self) -> String {
        format!("ec{}+{}", self.data_splits, self.parity_splits)
    }
}

impl fmt::Display for EcShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// How the server picks a new object's scheme and when it moves objects between schemes.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Every object gets this scheme unless the client or a prefix rule says otherwise; `None`
    /// lets size and hotness decide.
    pub fixed: Option<Scheme>,
    /// Keys starting with a prefix get its scheme (the longest matching prefix wins).
    pub prefixes: Vec<(Vec<u8>, Scheme)>,
    /// Values shorter than this start as `small_scheme`, the others as `large_scheme`.
    pub small_below_bytes: usize,
    pub small_scheme: Scheme,
    pub large_scheme: Scheme,
    /// An object not read for this long is cold: it moves to EC.
    pub cold_after: Duration,
    /// An EC object read this many times within `hot_window` is hot: it moves back to its size's
    /// scheme. 0 turns hotness off.
    pub hot_reads: u32,
    pub hot_window: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            fixed: None,
            prefixes: Vec::new(),
            small_below_bytes: 4096,
            small_scheme: Scheme::Rep2,
            large_scheme: Scheme::Eor,
            cold_after: Duration::from_secs(60),
            hot_reads: 3,
            hot_window: Duration::from_secs(10),
        }
    }
}

impl Policy {
    /// The scheme of a new object: the client's hint, then a prefix rule, then `fixed`, then
    /// size.
    pub fn choose(&self, key: &[u8], value_bytes: usize, hint: Option<Scheme>) -> Scheme {
        if let Some(scheme) = hint {
            return scheme;
        }
        if let Some(scheme) = self.prefix_rule(key) {
            return scheme;
        }
        if let Some(scheme) = self.fixed {
            return scheme;
        }
        self.by_size(value_bytes)
    }

    pub fn by_size(&self, value_bytes: usize) -> Scheme {
        if value_bytes < self.small_below_bytes {
            self.small_scheme
        } else {
            self.large_scheme
        }
    }

    pub fn prefix_rule(&self, key: &[u8]) -> Option<Scheme> {
        self.prefixes
            .iter()
            .filter(|(prefix, _)| key.starts_with(prefix))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, scheme)| *scheme)
    }

    /// Whether hotness may move this object: not when its scheme was asked for explicitly.
    pub fn adaptive(&self, key: &[u8], pinned: bool) -> bool {
        !pinned && self.fixed.is_none() && self.prefix_rule(key).is_none() && self.hot_reads > 0
    }
}

/// The shape of a scheme's region (EOR: the EC one).
pub fn region_shape(scheme: Scheme, ec: EcShape) -> Shape {
    let (data_splits, parity_splits) = match scheme {
        Scheme::None => (1, 0),
        Scheme::Rep2 => (1, 1),
        Scheme::Rep3 => (1, 2),
        Scheme::Ec | Scheme::Eor => (ec.data_splits, ec.parity_splits),
    };
    Shape { data_splits, parity_splits, extra_reads: parity_splits.min(1) }
}

/// The schemes a server needs regions for: all of them when the policy may pick any, else the
/// ones its rules name (EC included: cold objects move there).
pub fn schemes_needed(policy: &Policy) -> Vec<Scheme> {
    match policy.fixed {
        None => Scheme::ALL.to_vec(),
        Some(fixed) => {
            let mut schemes = vec![fixed];
            for (_, scheme) in &policy.prefixes {
                if !schemes.contains(scheme) {
                    schemes.push(*scheme);
                }
            }
            schemes
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EC: EcShape = EcShape { data_splits: 8, parity_splits: 2 };

    #[test]
    fn scheme_names_parse_and_other_shapes_are_refused() {
        assert_eq!(Scheme::parse(b"ec8+2", EC), Ok(Scheme::Ec));
        assert_eq!(Scheme::parse(b"EOR2", EC), Ok(Scheme::Eor));
        assert_eq!(Scheme::parse(b"rep3", EC), Ok(Scheme::Rep3));
        assert!(matches!(Scheme::parse(b"ec4+2", EC), Err(SchemeError::OtherShape { .. })));
        assert!(matches!(Scheme::parse(b"\xff", EC), Err(SchemeError::Unknown(_))));
        for scheme in Scheme::ALL {
            assert_eq!(Scheme::parse(scheme.label(EC).as_bytes(), EC), Ok(scheme));
        }
    }

    #[test]
    fn policy_prefers_hint_then_longest_prefix_then_size() {
        let policy = Policy {
            prefixes: vec![(b"session:".to_vec(), Scheme::None), (b"session:keep:".to_vec(), Scheme::Rep3)],
            ..Policy::default()
        };
        assert_eq!(policy.choose(b"session:keep:1", 10, None), Scheme::Rep3);
        assert_eq!(policy.choose(b"session:1", 10, None), Scheme::None);
        assert_eq!(policy.choose(b"session:1", 10, Some(Scheme::Ec)), Scheme::Ec);
        assert_eq!(policy.choose(b"x", 100, None), Scheme::Rep2);
        assert_eq!(policy.choose(b"x", 100_000, None), Scheme::Eor);
    }
}
