//! The start of a TCP connection where encryption is in play (`--encrypt`, docs/SECURITY.md):
//! the node's half of the Noise handshake (`remem_proto::encryption`), and plaintext read out of
//! the ciphertext that arrives after it. Unix connections never come here: they stay on the host.
//!
//! Fault model: nothing before the handshake's end is trusted, and every refusal here closes the
//! connection after a plaintext `Error` that says what to change: a node with `--encrypt` refuses
//! a plaintext client (`NotAuthenticated`), a node without it refuses a client that asks for
//! encryption (`Unsupported`), and a client that fails the Noise handshake (another secret, or an
//! altered message) gets `AuthFailed`. Afterwards a message that does not authenticate is an
//! `InvalidData` read error: the connection ends and the reason is logged. Both handshake
//! messages have a fixed size, so nothing is allocated from a length the peer chose.

use super::{Connection, ConnectionEnd};
use crate::stream::Stream;
use remem_proto::encryption::{self, Inbound, OPENING_BYTES, PREAMBLE};
use remem_proto::{ErrorCode, FrameHeader, HEADER_BYTES};
use std::io::{self, Read};
use std::time::Instant;

const ENCRYPTION_REQUIRED: &str =
    "this node requires encrypted TCP connections (remem node --encrypt): start the client with --encrypt";
const NOT_ENCRYPTING: &str = "this node does not encrypt TCP traffic, and the client asked for encryption \
     (--encrypt): start the node with --encrypt, or the client without it";

impl Connection {
    /// Looks at the first 16 bytes of a TCP connection: a frame header (plaintext) or the
    /// encryption preamble. A plaintext connection to a node without `--encrypt` is left as it
    /// was (the bytes stay buffered for the handshake); an encrypting one is set up.
    pub(super) fn open_tcp(&mut self, deadline: Instant) -> Result<(), ConnectionEnd> {
        self.fill_to(HEADER_BYTES, deadline)?;
        let first: [u8; HEADER_BYTES] =
            self.input[self.start..self.start + HEADER_BYTES].try_into().expect("slice of the header length");
        match (self.shared.encrypt, first == PREAMBLE) {
            (false, false) => Ok(()),
            (false, true) => Err(self.refuse(0, ErrorCode::Unsupported, NOT_ENCRYPTING)),
            (true, false) => Err(self.refuse(
                FrameHeader::raw_request_id(&first),
                ErrorCode::NotAuthenticated,
                ENCRYPTION_REQUIRED,
            )),
            (true, true) => self.start_encryption(deadline),
        }
    }

    /// Answers the client's message 1; from here on every byte each way is sealed.
    fn start_encryption(&mut self, deadline: Instant) -> Result<(), ConnectionEnd> {
        self.fill_to(OPENING_BYTES, deadline)?;
        let opening: [u8; OPENING_BYTES] = self.input[self.start..self.start + OPENING_BYTES]
            .try_into()
            .expect("slice of the opening length");
        self.start += OPENING_BYTES;
        let mut reply = Vec::with_capacity(OPENING_BYTES);
        let (sealer, opener) = match encryption::respond(&self.shared.secret, &opening, &mut reply) {
            Ok(halves) => halves,
            Err(error) => return Err(self.refuse(0, ErrorCode::AuthFailed, error.to_string())),
        };
        // Message 2 is the last plaintext the node sends.
        self.handle.write_frames(&reply, None)?;
        self.handle.start_encrypting(sealer);
        let mut inbound = Box::new(Inbound::new(opener));
        // What the client sent after its opening is ciphertext already.
        let early = &self.input[self.start..self.end];
        inbound.spare()[..early.len()].copy_from_slice(early);
        inbound.received(early.len());
        (self.start, self.end) = (0, 0);
        self.inbound = Some(inbound);
        Ok(())
    }

    /// Reads until `bytes` are buffered, within the handshake's deadline.
    fn fill_to(&mut self, bytes: usize, deadline: Instant) -> Result<(), ConnectionEnd> {
        while self.end - self.start < bytes {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::from(io::ErrorKind::TimedOut).into());
            }
            self.stream.set_read_timeout(Some(left))?;
            self.fill()?;
        }
        Ok(())
    }

    /// Nothing received waits to be served: no frame bytes, no ciphertext.
    pub(super) fn nothing_buffered(&self) -> bool {
        self.start == self.end && self.inbound.as_ref().is_none_or(|inbound| inbound.is_empty())
    }
}

/// One `read` of plaintext on an encrypted connection: what whole messages already hold, else
/// one socket read and what it completed, which may be nothing (`Some(0)`): a peer dripping a
/// message byte by byte meets the caller's deadlines between reads. `None` is a clean end between
/// messages; a message that does not authenticate is `InvalidData`.
pub(super) fn read_decrypted(
    stream: &Stream,
    inbound: &mut Inbound,
    out: &mut [u8],
) -> io::Result<Option<usize>> {
    let invalid = |error| io::Error::new(io::ErrorKind::InvalidData, error);
    let taken = inbound.take_plaintext(out).map_err(invalid)?;
    if taken > 0 {
        return Ok(Some(taken));
    }
    match (&mut &*stream).read(inbound.spare())? {
        0 if inbound.is_empty() => Ok(None),
        0 => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the connection closed inside an encrypted message",
        )),
        received => {
            inbound.received(received);
            Ok(Some(inbound.take_plaintext(out).map_err(invalid)?))
        }
    }
}
