//! The one place where remem's errors become NBD error values (docs/NBD.md, "Errors").
//!
//! A page that cannot be read correctly or a write that cannot reach k splits is `EIO`: the
//! client never returns wrong data, so the NBD client never sees it either. A request outside
//! the export is `EINVAL` (reads, trims) or `ENOSPC` (writes), as the spec asks. A page error
//! that names an argument this server built (`OutOfRange`, `BadBuffer`) is a bug here, still
//! answered with `EINVAL` rather than a panic in front of a block device.

use remem_client::PageError;

use crate::protocol::ErrorCode;

/// The NBD error a failed page operation returns.
pub fn page_error_code(error: &PageError) -> ErrorCode {
    match error {
        PageError::Lost { .. }
        | PageError::WriteFailed { .. }
        | PageError::Decode { .. }
        | PageError::NodeDown { .. }
        | PageError::Timeout { .. }
        | PageError::Refused { .. }
        | PageError::Protocol { .. } => ErrorCode::Io,
        // NBD never writes data splits and parities apart, nor maps ranges lazily: a parity or
        // unmapped-range error is a bug here too.
        PageError::OutOfRange { .. }
        | PageError::Unmapped { .. }
        | PageError::BadBuffer { .. }
        | PageError::NotParityStale { .. }
        | PageError::ParityStaleLost { .. } => ErrorCode::Invalid,
    }
}

/// Why a connection ended other than by the client's choice.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("handshake: {0}")]
    Handshake(#[from] crate::handshake::HandshakeError),
    #[error("protocol violation: {0}")]
    Protocol(#[from] crate::protocol::DecodeError),
    #[error("write request of {length} bytes exceeds the {max_bytes}-byte limit")]
    WriteTooLarge { length: u32, max_bytes: u32 },
    #[error("the page store lock is poisoned: a thread panicked while driving the client")]
    StorePoisoned,
    #[error("TLS: {0}")]
    Tls(rustls::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_and_failed_pages_are_eio() {
        let lost =
            PageError::Lost { page: 1, range: 0, valid_splits: 7, needed_splits: 8, failed_nodes: vec![] };
        assert_eq!(page_error_code(&lost), ErrorCode::Io);
        let failed = PageError::WriteFailed {
            page: 1,
            range: 0,
            stored_splits: 7,
            needed_splits: 8,
            failed_nodes: vec![],
        };
        assert_eq!(page_error_code(&failed), ErrorCode::Io);
        assert_eq!(page_error_code(&PageError::OutOfRange { page: 9, page_count: 1 }), ErrorCode::Invalid);
    }
}
