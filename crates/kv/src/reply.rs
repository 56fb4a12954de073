//! Replies and where they go: a reply's place in its connection's order, the queue of replies
//! the server sends ([`Outbox`]), and the rendering of what the engine hands up (values as text
//! `VALUE` lines, meta `VA` lines or `ma` numbers; the engine's errors as memcached's
//! `SERVER_ERROR` lines). No cache state.

use remem_memcache::response;

use crate::completion::{ArithmeticReply, ConnRef, Render};
use crate::error::{StoreError, ValueError};

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

/// Replies ready to go, in the order they were made (the server puts them in each
/// connection's order).
#[derive(Debug, Default)]
pub struct Outbox {
    outs: Vec<Out>,
}

impl Outbox {
    pub fn reply(&mut self, conn: ConnRef, seq: u64, bytes: Vec<u8>) {
        self.outs.push(Out { conn, seq, bytes, ends_through: None, reserved: 0 });
    }

    /// A reply, or nothing for a `noreply` command (its place still sends, empty).
    pub fn reply_unless(&mut self, noreply: bool, conn: ConnRef, seq: u64, bytes: Vec<u8>) {
        self.reply(conn, seq, if noreply { Vec::new() } else { bytes });
    }

    pub fn push(&mut self, out: Out) {
        self.outs.push(out);
    }

    pub fn is_empty(&self) -> bool {
        self.outs.is_empty()
    }

    /// Every reply made since the last call.
    pub fn take(&mut self) -> Vec<Out> {
        std::mem::take(&mut self.outs)
    }
}

/// The text of a value for its waiter.
pub fn render_value(render: &Render, value: &[u8]) -> Vec<u8> {
    match render {
        Render::Text { key, flags, cas } => {
            let mut out = Vec::with_capacity(value.len() + key.len() + 48);
            response::value(&mut out, key, *flags, value, *cas);
            out
        }
        Render::Meta { head, return_value } => meta_value(head, *return_value, value),
    }
}

/// A meta reply with its value: the HD line turned into `VA <size>` and the data block.
pub fn meta_value(head: &[u8], return_value: bool, value: &[u8]) -> Vec<u8> {
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

/// The reply of an `ma` whose result is `number`.
pub fn arithmetic_reply(reply: &ArithmeticReply, number: u64) -> Vec<u8> {
    if reply.hd_line.is_empty() {
        return Vec::new();
    }
    meta_value(&reply.hd_line, reply.return_value, number.to_string().as_bytes())
}

/// A value remote memory lost (a get's or a read-modify-write's).
pub fn lost_value(error: &ValueError) -> Vec<u8> {
    format!("SERVER_ERROR remote memory lost the value: {error}\r\n").into_bytes()
}

/// A store whose write (or record) failed.
pub fn store_failed(error: &ValueError) -> Vec<u8> {
    format!("SERVER_ERROR remote memory could not store the value: {error}\r\n").into_bytes()
}

/// A store that could not start.
pub fn refused(error: StoreError) -> Vec<u8> {
    format!("SERVER_ERROR {error}\r\n").into_bytes()
}
