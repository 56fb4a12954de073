//! Replies and where they go: the connection a reply is for, its place in that connection's
//! order, and how a value read from remote memory is rendered for the command that asked
//! (text `VALUE` lines, meta `VA` lines, `ma` numbers). No cache state: the engine (`cache.rs`)
//! renders a get's reply with these when its value arrives, the command layers when they answer.

use remem_memcache::response;

/// A connection as the cache names it; a reply to a connection that closed is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnRef {
    pub index: usize,
    pub generation: u64,
}

/// A reply, in the place `seq` of its connection's reply order.
#[derive(Debug)]
pub struct Out {
    pub conn: ConnRef,
    pub seq: u64,
    pub bytes: Vec<u8>,
    /// This reply ends its command early: the places after it up to this one (the rest of a
    /// multi-key get and its `END`) send nothing.
    pub ends_through: Option<u64>,
    /// Bytes reserved in the cache's output budget (`budget.rs`) for this reply when its value
    /// was looked up: the server releases them as it takes the reply (and holds the reply's own bytes instead).
    pub reserved: usize,
}

/// How a fetched value is rendered for its waiter.
#[derive(Clone, Debug)]
pub enum Render {
    /// Text get/gets: `VALUE key flags bytes [cas]`.
    Text { key: Box<[u8]>, flags: u32, cas: Option<u64> },
    /// Meta get: the reply line is built by [`meta_value`] with the value.
    Meta { head: Box<[u8]>, opaque_and_key: Box<[u8]>, return_value: bool },
}

/// The text of a value for its waiter.
pub fn render_value(render: &Render, value: &[u8]) -> Vec<u8> {
    match render {
        Render::Text { key, flags, cas } => {
            let mut out = Vec::with_capacity(value.len() + key.len() + 48);
            response::value(&mut out, key, *flags, value, *cas);
            out
        }
        Render::Meta { head, opaque_and_key, return_value } => {
            meta_value(head, opaque_and_key, *return_value, value)
        }
    }
}

/// A meta reply with its value: the HD line turned into `VA <size>` and the data block.
pub fn meta_value(head: &[u8], _opaque_and_key: &[u8], return_value: bool, value: &[u8]) -> Vec<u8> {
    if !return_value {
        return head.to_vec();
    }
    let mut out = Vec::with_capacity(head.len() + value.len() + 16);
    out.extend_from_slice(b"VA ");
    out.extend_from_slice(value.len().to_string().as_bytes());
    // `head` is "HD<flags>\r\n": keep the flags.
    out.extend_from_slice(&head[2..]);
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
    out
}

/// How to answer an `ma` once its number is known.
#[derive(Debug)]
pub struct ArithmeticReply {
    /// The HD line with the return flags (empty when quiet mode hides it).
    pub hd_line: Vec<u8>,
    pub return_value: bool,
}

/// The reply of an `ma` whose result is `number`.
pub fn arithmetic_reply(reply: &ArithmeticReply, number: u64) -> Vec<u8> {
    if reply.hd_line.is_empty() {
        return Vec::new();
    }
    meta_value(&reply.hd_line, &[], reply.return_value, number.to_string().as_bytes())
}
