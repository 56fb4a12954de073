//! Meta protocol replies: `<CD> <flags>*\r\n`, and for VA a data block.
//!
//! Which return flags are echoed, and in which order, follows memcached: the flags appear in the
//! order the client requested them, and each command echoes only some of them:
//! - `mg` hit (HD/VA): `s t c f l h O k`, then `Z` (a win was already handed out), `X` (stale),
//!   `W` (this client won the recache), in that order; `mg` miss (EN): `O k`;
//! - `ms` (every code): `O k c s`;
//! - `md` (every code): `O k`;
//! - `ma` success (HD/VA): `c t O k`; other codes: `O k`.
//!
//! `k` echoes the key, base64-encoded and followed by a ` b` flag when the request had `b`.
//!
//! Quiet mode (`q`) hides the uninteresting reply, as memcached does: `mg` EN, `ms` HD, `md` HD,
//! `ma` HD and VA. Every other code, and every error line, is still sent. A client pipelining
//! quiet commands ends the batch with `mn`, answered by [`noop`].

use base64::Engine;

use crate::meta::BASE64;
use crate::request::MetaFlags;
use crate::response::{push_i64, push_u64};

/// The meta command being answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaCommand {
    /// `mg`.
    Get,
    /// `ms`.
    Set,
    /// `md`.
    Delete,
    /// `ma`.
    Arithmetic,
}

/// A meta return code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaStatus {
    /// `HD`: success without a value (mg hit without `v`, ms stored, md deleted, ma done).
    Hd,
    /// `VA <size>`: success with a value (mg/ma with `v`); a data block follows.
    Va,
    /// `EN`: mg miss.
    En,
    /// `NF`: not found (md, ma, ms with C on a missing item).
    Nf,
    /// `NS`: not stored (ms add on an existing key, replace on a missing one; ma vivify failed).
    Ns,
    /// `EX`: cas mismatch.
    Ex,
}

impl MetaStatus {
    /// The status of an `mg` hit: VA when the request asked for the value (`v`), else HD.
    pub fn hit(flags: &MetaFlags<'_>) -> Self {
        if flags.return_value {
            Self::Va
        } else {
            Self::Hd
        }
    }

    fn code(self) -> &'static [u8] {
        match self {
            Self::Hd => b"HD",
            Self::Va => b"VA",
            Self::En => b"EN",
            Self::Nf => b"NF",
            Self::Ns => b"NS",
            Self::Ex => b"EX",
        }
    }

    fn is_success(self) -> bool {
        matches!(self, Self::Hd | Self::Va)
    }
}

/// What the server knows about the item, for the return flags. Fields a reply does not echo are
/// ignored, so a miss can pass `MetaItem::default()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MetaItem {
    /// `c`: the item's cas value (after the command: the new cas of a store or an arithmetic).
    pub cas: u64,
    /// `f`: the client flags.
    pub client_flags: u32,
    /// `t`: remaining TTL in seconds, -1 for none (see [`crate::Expiry::ttl_seconds`]).
    pub ttl_seconds: i64,
    /// `s`: the value's size in bytes (after an append/prepend: the new size).
    pub size: u64,
    /// `h`: whether the item had been fetched before this command.
    pub hit_before: bool,
    /// `l`: seconds since the item's last access, before this command.
    pub last_access_seconds: u64,
    /// `W`: this client won the right to recache the item (mg with N or R, or a stale item).
    pub won: bool,
    /// `X`: the item is stale (invalidated by `md ... I`).
    pub stale: bool,
    /// `Z`: a win was already handed to another client.
    pub win_already_sent: bool,
}

/// Appends the reply of one mg, ms, md or ma, unless quiet mode hides it; returns whether it
/// wrote anything.
///
/// `key` is the decoded key (the server's view); it is re-encoded when `flags.base64_key`.
/// `value` is the data block for [`MetaStatus::Va`] (for ma: the new number's decimal digits) and
/// is ignored otherwise. Panics on VA without a value (a programmer error).
pub fn reply(
    out: &mut Vec<u8>,
    command: MetaCommand,
    status: MetaStatus,
    flags: &MetaFlags<'_>,
    key: &[u8],
    item: &MetaItem,
    value: Option<&[u8]>,
) -> bool {
    let hidden = flags.quiet
        && match command {
            MetaCommand::Get => status == MetaStatus::En,
            MetaCommand::Set | MetaCommand::Delete => status == MetaStatus::Hd,
            MetaCommand::Arithmetic => status.is_success(),
        };
    if hidden {
        return false;
    }
    out.extend_from_slice(status.code());
    let value = if status == MetaStatus::Va {
        let value = value.expect("a VA reply carries a value");
        out.push(b' ');
        push_u64(out, value.len() as u64);
        Some(value)
    } else {
        None
    };
    let echoed: &[u8] = match (command, status.is_success()) {
        (MetaCommand::Get, true) => b"stcflhOk",
        (MetaCommand::Set, _) => b"Okcs",
        (MetaCommand::Arithmetic, true) => b"ctOk",
        _ => b"Ok",
    };
    for &letter in flags.order.as_slice() {
        if echoed.contains(&letter) {
            return_flag(out, letter, flags, key, item);
        }
    }
    if command == MetaCommand::Get && status.is_success() {
        for (set, letter) in [(item.win_already_sent, b'Z'), (item.stale, b'X'), (item.won, b'W')] {
            if set {
                out.extend_from_slice(&[b' ', letter]);
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    if let Some(value) = value {
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    true
}

/// Appends ` <letter><value>` for one requested return flag.
fn return_flag(out: &mut Vec<u8>, letter: u8, flags: &MetaFlags<'_>, key: &[u8], item: &MetaItem) {
    out.push(b' ');
    out.push(letter);
    match letter {
        b's' => push_u64(out, item.size),
        b't' => push_i64(out, item.ttl_seconds),
        b'c' => push_u64(out, item.cas),
        b'f' => push_u64(out, u64::from(item.client_flags)),
        b'l' => push_u64(out, item.last_access_seconds),
        b'h' => out.push(if item.hit_before { b'1' } else { b'0' }),
        b'O' => out.extend_from_slice(flags.opaque.unwrap_or_default()),
        b'k' => push_key(out, key, flags.base64_key),
        _ => unreachable!("only echoed letters reach here"),
    }
}

/// Appends a key as memcached echoes it: raw, or base64 followed by ` b`.
fn push_key(out: &mut Vec<u8>, key: &[u8], base64_key: bool) {
    if base64_key {
        push_base64(out, key);
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(key);
    }
}

/// Appends the padded standard base64 form of `bytes`.
fn push_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    let start = out.len();
    out.resize(start + bytes.len().div_ceil(3) * 4, 0);
    let written = BASE64.encode_slice(bytes, &mut out[start..]).expect("the buffer fits the encoded bytes");
    out.truncate(start + written);
}

/// `MN`: the reply to `mn`.
pub fn noop(out: &mut Vec<u8>) {
    out.extend_from_slice(b"MN\r\n");
}

/// The internal metadata `me` prints (memcached's `exp la cas fetch cls size`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DebugInfo {
    /// `exp`: seconds until expiry, -1 for none.
    pub exptime_seconds: i64,
    /// `la`: seconds since the last access.
    pub last_access_seconds: u64,
    /// `cas`: the item's cas value.
    pub cas: u64,
    /// `fetch`: whether the item was fetched since it was stored.
    pub fetched: bool,
    /// `cls`: the storage class (memcached's slab class; remem's choice of number).
    pub class: u32,
    /// `size`: the item's total size in bytes.
    pub size: u64,
}

/// `ME <key> exp=.. la=.. cas=.. fetch=yes|no cls=.. size=..`: the reply to `me` on a hit
/// (a miss is `EN`, see [`miss`]). The key is base64-encoded when `base64_key`.
pub fn debug(out: &mut Vec<u8>, key: &[u8], base64_key: bool, info: &DebugInfo) {
    out.extend_from_slice(b"ME ");
    if base64_key {
        push_base64(out, key);
    } else {
        out.extend_from_slice(key);
    }
    out.extend_from_slice(b" exp=");
    push_i64(out, info.exptime_seconds);
    out.extend_from_slice(b" la=");
    push_u64(out, info.last_access_seconds);
    out.extend_from_slice(b" cas=");
    push_u64(out, info.cas);
    out.extend_from_slice(if info.fetched { b" fetch=yes" } else { b" fetch=no" });
    out.extend_from_slice(b" cls=");
    push_u64(out, u64::from(info.class));
    out.extend_from_slice(b" size=");
    push_u64(out, info.size);
    out.extend_from_slice(b"\r\n");
}

/// `EN`: the reply to `me` on a miss.
pub fn miss(out: &mut Vec<u8>) {
    out.extend_from_slice(b"EN\r\n");
}
