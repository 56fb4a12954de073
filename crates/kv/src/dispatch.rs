//! The one dispatcher: a request goes to the protocol layer that answers it (text commands in
//! `text.rs`, meta commands in `meta.rs`), and what the engine finished comes back through
//! [`settle`], which renders each typed completion as its reply (`reply.rs`) and hands values
//! fetched for read-modify-writes to `commands.rs`. The engine never calls up: every caller of
//! the engine runs [`settle`] after it (this module, the server loop), before the next request
//! is looked at, so each request sees every earlier one's effect.

use remem_memcache::Request;

use crate::cache::Cache;
use crate::completion::{Completion, ConnRef};
use crate::page_client::PageClient;
use crate::reply::{self, Out, Outbox};
use crate::text::After;

pub fn execute<P: PageClient>(
    cache: &mut Cache<P>,
    out: &mut Outbox,
    conn: ConnRef,
    next_seq: &mut u64,
    request: Request<'_>,
) -> After {
    settle(cache, out);
    let after = match crate::text::execute(cache, out, conn, next_seq, request) {
        Ok(after) => after,
        Err(meta) => {
            let now = cache.now_unix();
            crate::meta::execute(cache, out, conn, next_seq, meta, now)
        }
    };
    settle(cache, out);
    after
}

/// Answers everything the engine finished since the last call, in the order it finished.
/// Applying a read-modify-write may finish more (a store that fails at once): those are
/// answered in the same call.
pub fn settle<P: PageClient>(cache: &mut Cache<P>, out: &mut Outbox) {
    while let Some(completion) = cache.next_completion() {
        answer(cache, out, completion);
    }
}

fn answer<P: PageClient>(cache: &mut Cache<P>, out: &mut Outbox, completion: Completion) {
    match completion {
        Completion::Value { conn, seq, render, end, reserved, value } => {
            let (bytes, ends_through) = match value {
                Ok(value) => (reply::render_value(&render, &value), None),
                Err(error) => (reply::lost_value(&error), end),
            };
            out.push(Out { conn, seq, bytes, ends_through, reserved });
        }
        Completion::Stored { ack, result } => {
            let bytes = match result {
                Ok(()) => ack.ok,
                Err(error) => reply::store_failed(&error),
            };
            out.reply_unless(ack.noreply, ack.conn, ack.seq, bytes);
        }
        Completion::RmwValue { key, value } => crate::commands::rmw_fetched(cache, out, &key, value),
        Completion::Transitioned { conn, seq, result } => {
            let bytes = match result {
                Ok(moved) => {
                    format!("TRANSITIONED {} {} {}\r\n", moved.bytes_read, moved.bytes_written, moved.micros)
                }
                Err(error) => format!("SERVER_ERROR transition failed: {error}\r\n"),
            };
            out.reply(conn, seq, bytes.into_bytes());
        }
    }
}
