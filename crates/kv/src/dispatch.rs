//! One request to the command layer that answers it: text commands (`text.rs`) or meta
//! commands (`meta.rs`), with the values the engine fetched for read-modify-writes applied
//! before and after (`commands::settle`), so each request sees every earlier one's effect.

use remem_memcache::Request;

use crate::cache::Cache;
use crate::reply::ConnRef;
use crate::text::After;

pub fn execute(cache: &mut Cache, conn: ConnRef, next_seq: &mut u64, request: Request<'_>) -> After {
    crate::commands::settle(cache);
    let after = match crate::text::execute(cache, conn, next_seq, request) {
        Ok(after) => after,
        Err(meta) => crate::meta::execute(cache, conn, next_seq, meta, crate::now_unix()),
    };
    crate::commands::settle(cache);
    after
}
