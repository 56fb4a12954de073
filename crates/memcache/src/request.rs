//! The typed requests [`crate::parse`] produces.
//!
//! Invariant: every borrowed slice in a [`Request`] points into the parser's input; the only
//! owned bytes are base64-decoded meta keys (`b` flag), which cannot be slices of the input.

use std::borrow::Cow;

/// A key as the server should look it up: borrowed from the input, or owned when a meta command
/// sent it base64-encoded (`b` flag) and the parser decoded it.
///
/// Text keys are 1..=[`crate::Limits::max_key_bytes`] bytes without control characters (bytes
/// below 0x21 and 0x7f); decoded meta keys may hold any bytes.
pub type Key<'a> = Cow<'a, [u8]>;

/// The most flag tokens one meta command may carry; more gives
/// [`crate::ProtocolError::TooManyFlags`]. memcached allows 20 tokens per meta command line:
/// the command, the key and 18 flags.
pub const MAX_META_FLAGS: usize = 18;

/// Which of the six text storage commands a [`Request::Store`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreMode {
    /// `set`: store unconditionally.
    Set,
    /// `add`: store only if the key holds no item.
    Add,
    /// `replace`: store only if the key holds an item.
    Replace,
    /// `append`: add the data after the existing item's data; flags and exptime are ignored.
    Append,
    /// `prepend`: add the data before the existing item's data; flags and exptime are ignored.
    Prepend,
    /// `cas`: store only if the item's cas unique is still `cas_unique`.
    Cas,
}

impl StoreMode {
    /// The command name on the wire.
    pub fn command(self) -> &'static str {
        match self {
            Self::Set => "set",
            Self::Add => "add",
            Self::Replace => "replace",
            Self::Append => "append",
            Self::Prepend => "prepend",
            Self::Cas => "cas",
        }
    }
}

/// One parsed memcached request.
///
/// Exptimes are memcached's raw values (32-bit on the wire, widened): turn them into deadlines
/// with [`crate::expiry_deadline`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`/`gets <key>+` and `gat`/`gats <exptime> <key>+`. Reply: one [`crate::response::value`]
    /// per hit, in key order, then [`crate::response::end`].
    Get {
        /// The keys in request order; duplicates are kept (memcached answers each).
        keys: Vec<Key<'a>>,
        /// `gets`/`gats`: the VALUE lines carry the cas unique.
        with_cas: bool,
        /// `gat`/`gats`: the new exptime of every hit.
        touch_exptime: Option<i64>,
    },
    /// `set`, `add`, `replace`, `append`, `prepend`, `cas`. Reply: STORED, NOT_STORED, EXISTS
    /// (cas), NOT_FOUND (cas), unless `noreply`.
    Store {
        /// Which storage command.
        mode: StoreMode,
        /// The item's key.
        key: Key<'a>,
        /// The client's opaque 32-bit flags, returned by later gets.
        flags: u32,
        /// Raw exptime (see [`crate::expiry_deadline`]).
        exptime: i64,
        /// The data block, without its trailing "\r\n"; at most `max_item_bytes` long.
        data: &'a [u8],
        /// The cas unique to compare (`cas` only; 0 otherwise).
        cas_unique: u64,
        /// The client reads no reply: send none, not even an error.
        noreply: bool,
    },
    /// `incr`/`decr <key> <delta>`. Reply: the new value as a decimal line, NOT_FOUND, or
    /// [`crate::ProtocolError::NonNumericValue`], unless `noreply`. `incr` wraps at 2^64, `decr`
    /// stops at 0.
    Arithmetic {
        /// `incr` (true) or `decr` (false).
        increment: bool,
        /// The item's key.
        key: Key<'a>,
        /// The amount to add or subtract.
        delta: u64,
        /// Send no reply.
        noreply: bool,
    },
    /// `delete <key>` (a legacy `0` argument is accepted). Reply: DELETED or NOT_FOUND.
    Delete {
        /// The item's key.
        key: Key<'a>,
        /// Send no reply.
        noreply: bool,
    },
    /// `touch <key> <exptime>`. Reply: TOUCHED or NOT_FOUND.
    Touch {
        /// The item's key.
        key: Key<'a>,
        /// The new raw exptime.
        exptime: i64,
        /// Send no reply.
        noreply: bool,
    },
    /// `flush_all [delay]`. Reply: OK. A delay of 0 or less flushes now; a positive delay is an
    /// exptime (relative up to 30 days, else absolute) after which every item older is invalid.
    FlushAll {
        /// The raw delay, 0 when absent.
        delay: i64,
        /// Send no reply.
        noreply: bool,
    },
    /// `stats [args]`. Reply: STAT lines then END (or ERROR for an unknown group).
    Stats {
        /// Everything after `stats` as written (for example `items`, `slabs`, `settings`,
        /// `detail dump`), or `None` for the general statistics.
        group: Option<&'a [u8]>,
    },
    /// `version`. Reply: `VERSION <version>`.
    Version,
    /// `verbosity <level>`. Reply: OK.
    Verbosity {
        /// The requested log level (memcached clamps it to its maximum).
        level: u32,
        /// Send no reply.
        noreply: bool,
    },
    /// `slabs automove <level>` (or `ratio <float>`): memcached's switch for moving slab pages
    /// between size classes. Reply: OK. remem's pages serve any class as needed, so there is
    /// nothing to switch; the command is accepted so that scripts tuning memcached keep working.
    SlabsAutomove {
        /// Send no reply.
        noreply: bool,
    },
    /// `quit`: close the connection after writing the replies already due; no reply.
    Quit,
    /// `mg <key> <flags>*`. Reply: see [`crate::response::meta`].
    MetaGet {
        /// The key, base64-decoded when `flags.base64_key`.
        key: Key<'a>,
        /// The parsed flags.
        flags: MetaFlags<'a>,
    },
    /// `ms <key> <datalen> <flags>*` and its data block.
    MetaSet {
        /// The key, base64-decoded when `flags.base64_key`.
        key: Key<'a>,
        /// The data block without its trailing "\r\n".
        data: &'a [u8],
        /// The parsed flags; [`MetaFlags::set_mode`] gives the storage mode.
        flags: MetaFlags<'a>,
    },
    /// `md <key> <flags>*`.
    MetaDelete {
        /// The key, base64-decoded when `flags.base64_key`.
        key: Key<'a>,
        /// The parsed flags.
        flags: MetaFlags<'a>,
    },
    /// `ma <key> <flags>*`; [`MetaFlags::decrement`] tells the direction.
    MetaArithmetic {
        /// The key, base64-decoded when `flags.base64_key`.
        key: Key<'a>,
        /// The parsed flags.
        flags: MetaFlags<'a>,
    },
    /// `mn`. Reply: MN (also the client's signal that every earlier quiet command is done).
    MetaNoop,
    /// `me <key> [b]`. Reply: [`crate::response::meta::debug`] or EN.
    MetaDebug {
        /// The key, base64-decoded when `base64_key`.
        key: Key<'a>,
        /// The key was sent base64-encoded and must be returned so.
        base64_key: bool,
    },
    /// remem extension, not memcached: `transition <key> <scheme> [naive]` changes the redundancy
    /// scheme of one object. Reply (server-defined): OK, NOT_FOUND or an error line.
    Transition {
        /// The object's key.
        key: Key<'a>,
        /// The scheme's name as written (for example `rep3`, `ec8+2`); the server interprets it.
        scheme: &'a [u8],
        /// Re-encode by reading and rewriting the whole object instead of the incremental path.
        naive: bool,
    },
}

/// The letters of a meta command's flags in request order, which is the order memcached echoes
/// the return flags in. Holds at most [`MAX_META_FLAGS`] letters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlagOrder {
    letters: [u8; MAX_META_FLAGS],
    len: u8,
}

impl FlagOrder {
    /// Appends a flag letter. Panics when already full: the parser checks the count first, so a
    /// full order is a programmer error.
    pub fn push(&mut self, letter: u8) {
        let len = usize::from(self.len);
        assert!(len < MAX_META_FLAGS, "FlagOrder holds at most {MAX_META_FLAGS} flags");
        self.letters[len] = letter;
        self.len += 1;
    }

    /// The letters in request order.
    pub fn as_slice(&self) -> &[u8] {
        &self.letters[..usize::from(self.len)]
    }

    /// Whether `letter` was requested.
    pub fn contains(&self, letter: u8) -> bool {
        self.as_slice().contains(&letter)
    }
}

/// The mode of an `ms` (its `M` flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaSetMode {
    /// `MS` or no `M`: store unconditionally (a `C` flag makes it a compare-and-swap).
    Set,
    /// `ME`: store only if absent ("add"), else NS.
    Add,
    /// `MA`: append to the existing data (with `N`, create on a miss).
    Append,
    /// `MP`: prepend to the existing data (with `N`, create on a miss).
    Prepend,
    /// `MR`: store only if present ("replace"; with `C`, compare-and-swap).
    Replace,
}

/// The flags of one meta command (`mg`, `ms`, `md`, `ma`), parsed and validated.
///
/// memcached accepts every known flag on every meta command and ignores the ones that do not
/// apply; so does this parser. Numeric tokens are validated; exptime-like tokens (N, R, T) are
/// raw memcached exptimes (see [`crate::expiry_deadline`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MetaFlags<'a> {
    /// `b`: the key was base64-encoded; return it (k) encoded, followed by a `b` flag.
    pub base64_key: bool,
    /// `c`: return the item's cas value.
    pub return_cas: bool,
    /// `f`: return the item's client flags.
    pub return_client_flags: bool,
    /// `h`: return whether the item was hit before (0 or 1).
    pub return_hit_before: bool,
    /// `k`: return the key.
    pub return_key: bool,
    /// `l`: return the seconds since the item's last access.
    pub return_last_access: bool,
    /// `s`: return the item's size.
    pub return_size: bool,
    /// `t`: return the item's remaining TTL in seconds (-1 for none).
    pub return_ttl: bool,
    /// `v`: return the value (mg, ma): the reply is VA with a data block.
    pub return_value: bool,
    /// `q`: quiet: hide the uninteresting reply (see [`crate::response::meta`]).
    pub quiet: bool,
    /// `u`: do not bump the item in the LRU.
    pub no_lru_bump: bool,
    /// `x` (md): remove the value but keep the item.
    pub remove_value: bool,
    /// `I`: invalidate: md marks stale instead of deleting; ms with C accepts an older cas as stale.
    pub invalidate: bool,
    /// `O<token>`: opaque token to echo, without its `O` (at most 31 bytes).
    pub opaque: Option<&'a [u8]>,
    /// `C<cas>`: compare cas.
    pub compare_cas: Option<u64>,
    /// `E<cas>`: use this as the item's new cas.
    pub new_cas: Option<u64>,
    /// `F<flags>` (ms): client flags; 0 when absent.
    pub client_flags: Option<u32>,
    /// `N<exptime>`: vivify on miss with this exptime (mg, ma; ms in append/prepend mode).
    pub vivify_exptime: Option<i64>,
    /// `R<exptime>` (mg): win the recache if the remaining TTL is below this.
    pub recache_exptime: Option<i64>,
    /// `T<exptime>`: the item's (new) exptime.
    pub exptime: Option<i64>,
    /// `J<value>` (ma): initial value on vivify; 0 when absent.
    pub initial_value: Option<u64>,
    /// `D<delta>` (ma): delta; 1 when absent.
    pub delta: Option<u64>,
    /// `M<mode>`: the mode character, validated for ms (E A P R S) and ma (I + D -), kept raw
    /// and ignored by memcached on mg and md.
    pub mode: Option<u8>,
    /// remem: the token of the `P` flag, else of the `L` flag. memcached ignores both (they are
    /// proxy hints); remem reads them as the wanted redundancy scheme of the item.
    pub scheme_hint: Option<&'a [u8]>,
    /// Every flag letter in request order.
    pub order: FlagOrder,
}

impl MetaFlags<'_> {
    /// The storage mode of an `ms`. (Like memcached, the server should treat Set or Replace with
    /// a `C` flag as compare-and-swap.)
    pub fn set_mode(&self) -> MetaSetMode {
        match self.mode {
            Some(b'E') => MetaSetMode::Add,
            Some(b'A') => MetaSetMode::Append,
            Some(b'P') => MetaSetMode::Prepend,
            Some(b'R') => MetaSetMode::Replace,
            _ => MetaSetMode::Set,
        }
    }

    /// Whether an `ma` decrements (`MD` or `M-`); it increments otherwise.
    pub fn decrement(&self) -> bool {
        matches!(self.mode, Some(b'D') | Some(b'-'))
    }

    /// The delta of an `ma`: the `D` token, 1 when absent.
    pub fn delta_or_default(&self) -> u64 {
        self.delta.unwrap_or(1)
    }
}
