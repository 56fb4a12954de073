//! The engine's errors, typed. The protocol layer renders them (`dispatch.rs`, `commands.rs`):
//! memcached's `SERVER_ERROR ...` lines are made there, from these `Display` texts, so the
//! engine names no reply text. Errors shared by the waiters of one read are cheap to clone
//! (`Rc`): a fetch with many waiters hands each the same error.

use std::rc::Rc;

use remem_client::PageError;

use crate::backup::BackupError;

/// Why a store could not start: no room, or no region for the scheme. The texts follow
/// `SERVER_ERROR ` in memcached's replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("object too large for cache")]
    TooLarge,
    #[error("out of memory storing object")]
    OutOfMemory,
    #[error("this server does not offer that scheme")]
    NotOffered,
}

/// Why a value could not be read from remote memory or written there.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ValueError {
    /// A page op failed (more nodes lost than the scheme survives, a timeout, a refusal).
    #[error("{0}")]
    Page(Rc<PageError>),
    /// The first read of a restored value found other bytes than its record's checksum names.
    #[error("the value read does not match the checksum of its restored record")]
    RestoredChecksumMismatch,
    /// A small value's chunk page could not be read, and no other page of its class had room.
    #[error("the chunk page of its tail could not be read and no other has room")]
    TailPageUnreadable,
    /// An EC chunk page's rewrite could not be made safe: its intent was not written.
    #[error("the rewrites file could not take an intent: {0}")]
    IntentNotRecorded(Rc<std::io::Error>),
    /// An EC chunk page's rewrite could not be made safe: its journal copy was not written.
    #[error("its journal copy could not be written: {0}")]
    JournalNotWritten(Rc<PageError>),
    /// The value is in remote memory but its record for restarts could not be written.
    #[error("{0}")]
    NotRecorded(Rc<BackupError>),
    /// A transition's new place could not be had.
    #[error("{0}")]
    NoRoom(StoreError),
}

impl ValueError {
    /// The error of a failed page op, taken out of its completion (which keeps `Ok`).
    pub fn take_page(result: &mut Result<(), PageError>) -> Option<ValueError> {
        match std::mem::replace(result, Ok(())) {
            Ok(()) => None,
            Err(error) => Some(ValueError::Page(Rc::new(error))),
        }
    }
}

/// Why a transition did not start (`cache::transition::start`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error("no such key")]
    NotFound,
    #[error("the object is being written or moved; try again")]
    Busy,
    #[error("this server does not offer that scheme")]
    NotOffered,
}

/// Why the regions of a reopened slab map cannot hold this cache (`cache_over_regions`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegionsError {
    #[error("the saved regions have shapes {have:?}, these flags need {want:?}")]
    Shapes { have: Vec<String>, want: Vec<String> },
    #[error("the EC region of {pages} pages is too small")]
    EcTooSmall { pages: u64 },
}
