//! Encryption over a blocking stream: the client's half of the handshake ([`initiate`]) and
//! [`SecureStream`], which reads and writes plaintext through Noise transport messages. For the
//! blocking paths: a client's connect and handshake, a node's connections to its rebuild sources,
//! tools.

use super::{
    EncryptionError, Inbound, Initiator, Sealer, HANDSHAKE_MESSAGE_BYTES, LENGTH_BYTES, MAX_PLAINTEXT_BYTES,
};
use crate::auth::Secret;
use crate::sizes::{HEADER_BYTES, MAGIC};
use crate::{Control, ErrorCode, FrameHeader, Kind};
use std::io::{self, Read, Write};

/// A stream whose bytes travel encrypted. Each `write` seals at most [`MAX_PLAINTEXT_BYTES`] into
/// one message and writes it whole (a failed write leaves the stream unusable: drop it); `read`
/// hands out plaintext as messages authenticate, and fails with `InvalidData` on one that does
/// not.
pub struct SecureStream<S> {
    inner: S,
    sealer: Sealer,
    inbound: Inbound,
    sealed_out: Vec<u8>,
}

impl<S> SecureStream<S> {
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The socket and both halves of the cipher, for a caller that does its own I/O from now on
    /// (the client's event loop). Ciphertext already received stays in the [`Inbound`].
    pub fn into_parts(self) -> (S, Sealer, Inbound) {
        (self.inner, self.sealer, self.inbound)
    }

    pub fn from_parts(inner: S, sealer: Sealer, inbound: Inbound) -> SecureStream<S> {
        SecureStream { inner, sealer, inbound, sealed_out: Vec::new() }
    }
}

impl<S: Read> Read for SecureStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let taken = self.inbound.take_plaintext(buf).map_err(invalid_data)?;
            if taken > 0 {
                return Ok(taken);
            }
            match self.inner.read(self.inbound.spare()) {
                Ok(0) if self.inbound.is_empty() => return Ok(0),
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection closed inside an encrypted message",
                    ))
                }
                Ok(received) => self.inbound.received(received),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }
}

impl<S: Write> Write for SecureStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let count = buf.len().min(MAX_PLAINTEXT_BYTES);
        self.sealed_out.clear();
        self.sealer.seal(&buf[..count], &mut self.sealed_out).map_err(invalid_data)?;
        self.inner.write_all(&self.sealed_out)?;
        Ok(count)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn invalid_data(error: EncryptionError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

/// The client's half of the handshake on a freshly connected `stream`: sends the preamble and
/// message 1, reads message 2. Reads and writes are bounded by the stream's own timeouts.
///
/// Errors: [`EncryptionError::PlaintextNode`] when the node refuses in plaintext (it does not
/// encrypt: its `Error` frame is quoted), [`EncryptionError::NodeRefused`] when an encrypting
/// node failed our message 1 (`AuthFailed`: another secret), [`EncryptionError::PlaintextReply`] for any other
/// plaintext frame, [`EncryptionError::BadHandshakeLength`],
/// [`EncryptionError::HandshakeFailed`] when the node does not hold the secret, I/O errors.
pub fn initiate<S: Read + Write>(mut stream: S, secret: &Secret) -> Result<SecureStream<S>, EncryptionError> {
    let mut opening = Vec::with_capacity(super::OPENING_BYTES);
    let initiator = Initiator::start(secret, &mut opening);
    stream.write_all(&opening)?;
    let mut length = [0u8; LENGTH_BYTES];
    stream.read_exact(&mut length)?;
    if length == MAGIC.to_le_bytes() {
        return Err(plaintext_reply(&mut stream, length));
    }
    let len = u16::from_be_bytes(length) as usize;
    if len != HANDSHAKE_MESSAGE_BYTES {
        return Err(EncryptionError::BadHandshakeLength { len, expected: HANDSHAKE_MESSAGE_BYTES });
    }
    let mut message = [0u8; HANDSHAKE_MESSAGE_BYTES];
    stream.read_exact(&mut message)?;
    let (sealer, opener) = initiator.finish(&message)?;
    Ok(SecureStream { inner: stream, sealer, inbound: Inbound::new(opener), sealed_out: Vec::new() })
}

/// The node's half of the handshake on a blocking `stream` (tests and tools; the node itself
/// answers from its connection buffer with [`super::respond`]).
///
/// Errors: as [`super::respond`], and I/O errors.
pub fn accept<S: Read + Write>(mut stream: S, secret: &Secret) -> Result<SecureStream<S>, EncryptionError> {
    let mut opening = [0u8; super::OPENING_BYTES];
    stream.read_exact(&mut opening)?;
    let mut reply = Vec::with_capacity(LENGTH_BYTES + HANDSHAKE_MESSAGE_BYTES);
    let (sealer, opener) = super::respond(secret, &opening, &mut reply)?;
    stream.write_all(&reply)?;
    Ok(SecureStream::from_parts(stream, sealer, Inbound::new(opener)))
}

/// The node answered with a remem frame (`start` is its first two bytes, the magic): it does not
/// encrypt. Its `Error` is quoted when it sent one, so the user reads the node's reason.
fn plaintext_reply(stream: &mut impl Read, start: [u8; LENGTH_BYTES]) -> EncryptionError {
    let mut header = [0u8; HEADER_BYTES];
    header[..LENGTH_BYTES].copy_from_slice(&start);
    if let Err(error) = stream.read_exact(&mut header[LENGTH_BYTES..]) {
        return EncryptionError::PlaintextReply { what: format!("partial frame ({error})") };
    }
    let header = match FrameHeader::decode(&header) {
        Ok(header) => header,
        Err(error) => return EncryptionError::PlaintextReply { what: format!("malformed frame ({error})") },
    };
    if header.kind != Kind::Error {
        return EncryptionError::PlaintextReply { what: format!("{:?} frame", header.kind) };
    }
    // The header decoder bounds an Error body to a few hundred bytes.
    let mut body = vec![0u8; header.body_len as usize];
    if let Err(error) = stream.read_exact(&mut body) {
        return EncryptionError::PlaintextReply { what: format!("partial Error frame ({error})") };
    }
    match Control::decode_body(header.kind, &body) {
        // An encrypting node that could not complete the handshake says so in plaintext too.
        Ok(Control::Error { code: code @ ErrorCode::AuthFailed, message }) => {
            EncryptionError::NodeRefused { code, message }
        }
        Ok(Control::Error { code, message }) => EncryptionError::PlaintextNode { code, message },
        Ok(other) => EncryptionError::PlaintextReply { what: format!("{:?} frame", other.kind()) },
        Err(error) => EncryptionError::PlaintextReply { what: format!("malformed Error frame ({error})") },
    }
}
