//! What the engine hands up: typed completions, addressed to a (connection, place) the
//! protocol layer gave it, and the reply forms it carries for that layer without reading them.
//! The dispatcher (`dispatch.rs`) turns each completion into reply bytes; the engine makes no
//! reply text.
//!
//! Architecture Invariant: this module imports nothing of the crate but `error`: both the
//! engine below and the protocol layer above name it.

use std::rc::Rc;

use crate::error::ValueError;

/// A connection as the cache names it; a reply to a connection that closed is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnRef {
    pub index: usize,
    pub generation: u64,
}

/// How the protocol layer renders a fetched value for the request that asked (the engine
/// keeps it with the waiter and hands it back).
#[derive(Clone, Debug)]
pub enum Render {
    /// Text get/gets: `VALUE key flags bytes [cas]`.
    Text { key: Box<[u8]>, flags: u32, cas: Option<u64> },
    /// Meta get: the HD line, turned into `VA <size>` with the value.
    Meta { head: Box<[u8]>, return_value: bool },
}

/// How to answer an `ma` once its number is known.
#[derive(Debug)]
pub struct ArithmeticReply {
    /// The HD line with the return flags (empty when quiet mode hides it).
    pub hd_line: Vec<u8>,
    pub return_value: bool,
    /// The cas taken for this op's write when the request arrived (its reply's `c` shows it);
    /// the write of a chain of ops takes its last op's.
    pub cas: Option<u64>,
}

/// A reply owed when a store finishes: `ok` on success (prepared by the protocol layer), an
/// error reply otherwise.
#[derive(Debug)]
pub struct Ack {
    pub conn: ConnRef,
    pub seq: u64,
    pub ok: Vec<u8>,
    pub noreply: bool,
}

/// A value read from remote memory, or why it could not be.
pub type Fetched = Result<Rc<[u8]>, ValueError>;

/// What a finished transition moved (`TRANSITIONED <read> <written> <us>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moved {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub micros: u128,
}

/// One thing the engine finished, for the dispatcher to answer.
#[derive(Debug)]
pub enum Completion {
    /// A get's value arrived, or could not be read.
    Value {
        conn: ConnRef,
        seq: u64,
        render: Render,
        /// The place of a text get's `END`: a lost value's error ends the response there.
        end: Option<u64>,
        /// Bytes reserved in the output budget for the reply (`budget.rs`).
        reserved: usize,
        value: Fetched,
    },
    /// A store finished (`Err`: it is not in remote memory, or not recorded for restarts).
    Stored { ack: Ack, result: Result<(), ValueError> },
    /// The value a read-modify-write chain of `key` waited for.
    RmwValue { key: Box<[u8]>, value: Fetched },
    /// A transition a client asked for finished.
    Transitioned { conn: ConnRef, seq: u64, result: Result<Moved, ValueError> },
}
