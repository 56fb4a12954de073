//! What the NBD server needs from remote memory: the front ends' one page-store trait and its
//! in-memory model (`remem_frontend::page_store`), named here for the server's modules.

pub use remem_frontend::page_store::{MemoryStore, PageStore};
