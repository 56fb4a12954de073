//! Authenticated encryption of node traffic over TCP (`--encrypt`, docs/SECURITY.md), sans I/O:
//! the Noise handshake's two messages, and the transport messages every byte of the remem
//! stream travels in afterwards. The blocking wrapper is `stream`.
//!
//! Why Noise and this pattern: `Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s` (the `snow` crate). Every
//! holder of the cluster secret is equally trusted (docs/SECURITY.md), so per-host identities and
//! certificates (TLS) would add key management and protect nothing more: a pre-shared key derived
//! from the secret ([`Secret::noise_psk`], a keyed hash with its own label, never the secret
//! itself) authenticates both ends, and the ephemeral X25519 exchange gives each connection fresh
//! keys, so a secret that leaks later does not open recorded traffic. `psk0` mixes the key in
//! before the first message, so a peer without it cannot get a second message out of the node
//! that it could use, and the handshake costs one round trip. The existing HMAC handshake
//! (`auth`) runs unchanged inside the encrypted stream.
//!
//! Wire format: the client opens with [`PREAMBLE`] (16 bytes, the length of a frame header, and
//! never a header: it does not start with `MAGIC`), then message 1; the node answers message 2.
//! Every message, handshake or transport, is a 2-byte big-endian length and that many bytes
//! (at most 65535: [`MAX_MESSAGE_BYTES`]). Both handshake messages carry no payload and are
//! [`HANDSHAKE_MESSAGE_BYTES`] long. The preamble is the Noise prologue too, so both ends have
//! agreed on it once the handshake ends.
//!
//! Fault model: the peer, or the network, may send anything. Every length is checked before it
//! is used (a message shorter than its tag is refused), a message that does not authenticate
//! (altered, replayed, reordered, or sealed under another key) is an error the caller closes the
//! connection on, and nothing here panics on received bytes. Nonces are counters on both ends,
//! never sent, so a dropped or repeated message fails the next check.
//!
//! Invariant: no allocation per message once the buffers have their size: [`Sealer::seal`]
//! appends to the caller's buffer and [`Inbound`] opens into the caller's buffer (or, for a
//! message larger than the room left there, into a staging buffer allocated once).

mod stream;
#[cfg(test)]
mod tests;

pub use stream::{accept, initiate, SecureStream};

use crate::auth::Secret;
use crate::{ErrorCode, HEADER_BYTES};
use snow::StatelessTransportState;
use std::sync::Arc;

/// The Noise protocol name.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// What an encrypting client sends first, before message 1 of the handshake.
pub const PREAMBLE: [u8; HEADER_BYTES] = *b"remem-noise-v1\0\0";
/// The big-endian length before every message.
pub const LENGTH_BYTES: usize = 2;
/// Longest Noise message.
pub const MAX_MESSAGE_BYTES: usize = 65535;
/// The AEAD tag at the end of every transport message.
pub const TAG_BYTES: usize = 16;
/// Most plaintext one transport message carries.
pub const MAX_PLAINTEXT_BYTES: usize = MAX_MESSAGE_BYTES - TAG_BYTES;
/// Both handshake messages: an ephemeral public key (32 bytes) and the tag of an empty payload.
pub const HANDSHAKE_MESSAGE_BYTES: usize = 32 + TAG_BYTES;
/// What the node reads before it answers: the preamble, and message 1 with its length.
pub const OPENING_BYTES: usize = PREAMBLE.len() + LENGTH_BYTES + HANDSHAKE_MESSAGE_BYTES;
/// The most ciphertext [`Inbound`] buffers: two whole messages, so one `read` can take more than
/// one.
const INBOUND_BYTES: usize = 2 * (LENGTH_BYTES + MAX_MESSAGE_BYTES);

#[derive(Debug, thiserror::Error)]
pub enum EncryptionError {
    #[error("the peer did not open with remem's encryption preamble: it does not encrypt (first bytes {found:02x?})")]
    NoPreamble { found: [u8; 4] },
    #[error("a {len}-byte handshake message where {expected} bytes are the only length")]
    BadHandshakeLength { len: usize, expected: usize },
    #[error(
        "the encryption handshake failed: the peer does not hold this cluster's secret, or the \
         message was altered on the way"
    )]
    HandshakeFailed,
    #[error("a {len}-byte encrypted message is shorter than its {TAG_BYTES}-byte tag")]
    TooShort { len: usize },
    #[error(
        "an encrypted message did not authenticate (altered, replayed, reordered or sealed under \
         another key): the connection is closed"
    )]
    Unauthenticated,
    #[error("this connection sent 2^64 - 1 messages: it must be reopened")]
    NoncesExhausted,
    #[error(
        "the node does not encrypt its TCP traffic (it answered in plaintext: {code}: {message}); \
         start the node with --encrypt, or the client without it"
    )]
    PlaintextNode { code: ErrorCode, message: String },
    #[error("the node refused the encryption handshake: {code}: {message}")]
    NodeRefused { code: ErrorCode, message: String },
    #[error("the node answered the encryption handshake with a plaintext {what}: it does not encrypt")]
    PlaintextReply { what: String },
    #[error("I/O during the encryption handshake: {0}")]
    Io(#[from] std::io::Error),
}

fn noise_params() -> snow::params::NoiseParams {
    NOISE_PARAMS.parse().expect("NOISE_PARAMS names a pattern snow supports")
}

/// The client's half of the handshake, between message 1 and message 2.
pub struct Initiator {
    state: snow::HandshakeState,
}

impl Initiator {
    /// Starts a handshake keyed by `secret`; `opening` gets what to send first
    /// ([`OPENING_BYTES`]: the preamble, then message 1 with its length).
    pub fn start(secret: &Secret, opening: &mut Vec<u8>) -> Initiator {
        let psk = secret.noise_psk();
        let mut state = snow::Builder::new(noise_params())
            .prologue(&PREAMBLE)
            .and_then(|builder| builder.psk(0, &psk))
            .and_then(|builder| builder.build_initiator())
            .expect("a fixed pattern with its one psk builds");
        let mut message = [0u8; HANDSHAKE_MESSAGE_BYTES];
        let written = state.write_message(&[], &mut message).expect("message 1 fits its fixed size");
        assert_eq!(written, HANDSHAKE_MESSAGE_BYTES);
        opening.extend_from_slice(&PREAMBLE);
        opening.extend_from_slice(&(HANDSHAKE_MESSAGE_BYTES as u16).to_be_bytes());
        opening.extend_from_slice(&message);
        Initiator { state }
    }

    /// Message 2 (without its length, which the caller checked is [`HANDSHAKE_MESSAGE_BYTES`]).
    ///
    /// Errors: [`EncryptionError::HandshakeFailed`] if the node does not hold the secret.
    pub fn finish(mut self, message: &[u8]) -> Result<(Sealer, Opener), EncryptionError> {
        if message.len() != HANDSHAKE_MESSAGE_BYTES {
            return Err(EncryptionError::BadHandshakeLength {
                len: message.len(),
                expected: HANDSHAKE_MESSAGE_BYTES,
            });
        }
        let mut payload = [0u8; HANDSHAKE_MESSAGE_BYTES];
        self.state.read_message(message, &mut payload).map_err(|_| EncryptionError::HandshakeFailed)?;
        split(self.state)
    }
}

/// The node's half of the handshake: `opening` is the client's first [`OPENING_BYTES`]; appends
/// message 2 with its length to `reply`.
///
/// Errors: [`EncryptionError::NoPreamble`] if the client does not encrypt,
/// [`EncryptionError::BadHandshakeLength`], [`EncryptionError::HandshakeFailed`] if it does not
/// hold the secret.
pub fn respond(
    secret: &Secret,
    opening: &[u8; OPENING_BYTES],
    reply: &mut Vec<u8>,
) -> Result<(Sealer, Opener), EncryptionError> {
    if opening[..PREAMBLE.len()] != PREAMBLE {
        let found = opening[..4].try_into().expect("four bytes");
        return Err(EncryptionError::NoPreamble { found });
    }
    let rest = &opening[PREAMBLE.len()..];
    let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
    if len != HANDSHAKE_MESSAGE_BYTES {
        return Err(EncryptionError::BadHandshakeLength { len, expected: HANDSHAKE_MESSAGE_BYTES });
    }
    let psk = secret.noise_psk();
    let mut state = snow::Builder::new(noise_params())
        .prologue(&PREAMBLE)
        .and_then(|builder| builder.psk(0, &psk))
        .and_then(|builder| builder.build_responder())
        .expect("a fixed pattern with its one psk builds");
    let mut payload = [0u8; HANDSHAKE_MESSAGE_BYTES];
    state.read_message(&rest[LENGTH_BYTES..], &mut payload).map_err(|_| EncryptionError::HandshakeFailed)?;
    let mut message = [0u8; HANDSHAKE_MESSAGE_BYTES];
    let written = state.write_message(&[], &mut message).map_err(|_| EncryptionError::HandshakeFailed)?;
    assert_eq!(written, HANDSHAKE_MESSAGE_BYTES);
    reply.extend_from_slice(&(HANDSHAKE_MESSAGE_BYTES as u16).to_be_bytes());
    reply.extend_from_slice(&message);
    split(state)
}

/// The two directions of a finished handshake: one key each, each with its own nonce counter,
/// so the sending half and the receiving half can live on different threads (a node's notices
/// are sealed by whichever thread sends them).
fn split(state: snow::HandshakeState) -> Result<(Sealer, Opener), EncryptionError> {
    let transport =
        Arc::new(state.into_stateless_transport_mode().map_err(|_| EncryptionError::HandshakeFailed)?);
    Ok((Sealer { transport: Arc::clone(&transport), nonce: 0 }, Opener { transport, nonce: 0 }))
}

/// The sending half of an encrypted connection.
pub struct Sealer {
    transport: Arc<StatelessTransportState>,
    nonce: u64,
}

impl Sealer {
    /// Appends `plaintext` to `out` as transport messages of at most [`MAX_PLAINTEXT_BYTES`] each,
    /// each after its length. Allocates only if `out` lacks the capacity.
    ///
    /// Errors: [`EncryptionError::NoncesExhausted`] after 2^64 - 1 messages.
    pub fn seal(&mut self, plaintext: &[u8], out: &mut Vec<u8>) -> Result<(), EncryptionError> {
        for chunk in plaintext.chunks(MAX_PLAINTEXT_BYTES) {
            let at = out.len();
            let sealed_bytes = chunk.len() + TAG_BYTES;
            out.resize(at + LENGTH_BYTES + sealed_bytes, 0);
            out[at..at + LENGTH_BYTES].copy_from_slice(&(sealed_bytes as u16).to_be_bytes());
            let written = self
                .transport
                .write_message(self.nonce, chunk, &mut out[at + LENGTH_BYTES..])
                .map_err(|_| EncryptionError::NoncesExhausted)?;
            assert_eq!(written, sealed_bytes, "a sealed message is its plaintext and a tag");
            self.nonce += 1;
        }
        Ok(())
    }

    /// How many bytes [`Sealer::seal`] appends for `plaintext_bytes`.
    pub fn sealed_bytes(plaintext_bytes: usize) -> usize {
        plaintext_bytes + plaintext_bytes.div_ceil(MAX_PLAINTEXT_BYTES) * (LENGTH_BYTES + TAG_BYTES)
    }
}

/// The receiving half of an encrypted connection.
pub struct Opener {
    transport: Arc<StatelessTransportState>,
    nonce: u64,
}

impl Opener {
    /// The size of the message at the front of `sealed`, its length included, once that length
    /// has arrived.
    ///
    /// Errors: [`EncryptionError::TooShort`] for a length below the tag's.
    pub fn message_bytes(sealed: &[u8]) -> Result<Option<usize>, EncryptionError> {
        let Some(&[high, low]) = sealed.get(..LENGTH_BYTES) else { return Ok(None) };
        let len = u16::from_be_bytes([high, low]) as usize;
        if len < TAG_BYTES {
            return Err(EncryptionError::TooShort { len });
        }
        Ok(Some(LENGTH_BYTES + len))
    }

    /// Opens one whole `message` (its length included, as [`Opener::message_bytes`] measured)
    /// into `plaintext`, which must be exactly its plaintext's size.
    ///
    /// Errors: [`EncryptionError::Unauthenticated`].
    pub fn open(&mut self, message: &[u8], plaintext: &mut [u8]) -> Result<(), EncryptionError> {
        assert_eq!(Opener::message_bytes(message).ok().flatten(), Some(message.len()));
        assert_eq!(plaintext.len(), message.len() - LENGTH_BYTES - TAG_BYTES);
        let opened = self
            .transport
            .read_message(self.nonce, &message[LENGTH_BYTES..], plaintext)
            .map_err(|_| EncryptionError::Unauthenticated)?;
        assert_eq!(opened, plaintext.len());
        self.nonce += 1;
        Ok(())
    }
}

/// Received ciphertext, opened on demand into the caller's buffer: the receiving side of one
/// encrypted connection for a caller that reads the socket itself (the node's connection, the
/// client's event loop, [`SecureStream`]).
pub struct Inbound {
    opener: Opener,
    /// `sealed[start..end]` arrived and is not opened yet.
    sealed: Vec<u8>,
    start: usize,
    end: usize,
    /// A message opened whole that did not fit where the caller asked: `staged[staged_start..
    /// staged_end]` is still to hand out. Allocated the first time it is needed.
    staged: Vec<u8>,
    staged_start: usize,
    staged_end: usize,
}

impl Inbound {
    pub fn new(opener: Opener) -> Inbound {
        Inbound {
            opener,
            sealed: vec![0; INBOUND_BYTES],
            start: 0,
            end: 0,
            staged: Vec::new(),
            staged_start: 0,
            staged_end: 0,
        }
    }

    /// Where to read ciphertext into; call [`Inbound::received`] with what arrived. Never empty
    /// after [`Inbound::take_plaintext`] returned 0 for a non-empty buffer: what is left then is
    /// less than one whole message.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start > 0 {
            self.sealed.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        assert!(self.end < self.sealed.len(), "a whole message was left unopened");
        &mut self.sealed[self.end..]
    }

    pub fn received(&mut self, bytes: usize) {
        assert!(self.end + bytes <= self.sealed.len());
        self.end += bytes;
    }

    /// Nothing received is left unhanded: no partial message, no staged plaintext.
    pub fn is_empty(&self) -> bool {
        self.start == self.end && self.staged_start == self.staged_end
    }

    /// Hands out plaintext into `out` (not empty): what was staged first, then whole messages
    /// opened straight into `out` while they fit; the first one that does not fit in an empty
    /// `out` is opened into the staging buffer and handed out in parts. Returns the bytes
    /// written, 0 when no whole message has arrived.
    ///
    /// Errors: [`EncryptionError::TooShort`], [`EncryptionError::Unauthenticated`]: the
    /// connection cannot go on.
    pub fn take_plaintext(&mut self, out: &mut [u8]) -> Result<usize, EncryptionError> {
        assert!(!out.is_empty());
        let mut written = self.take_staged(out);
        if self.staged_start < self.staged_end {
            return Ok(written);
        }
        while let Some(message_bytes) = Opener::message_bytes(&self.sealed[self.start..self.end])? {
            if self.end - self.start < message_bytes {
                break;
            }
            let message = &self.sealed[self.start..self.start + message_bytes];
            let plaintext_bytes = message_bytes - LENGTH_BYTES - TAG_BYTES;
            if plaintext_bytes <= out.len() - written {
                self.opener.open(message, &mut out[written..written + plaintext_bytes])?;
                written += plaintext_bytes;
            } else if written == 0 {
                if self.staged.is_empty() {
                    self.staged = vec![0; MAX_PLAINTEXT_BYTES];
                }
                self.opener.open(message, &mut self.staged[..plaintext_bytes])?;
                (self.staged_start, self.staged_end) = (0, plaintext_bytes);
                self.start += message_bytes;
                written = self.take_staged(out);
                break;
            } else {
                break;
            }
            self.start += message_bytes;
        }
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        Ok(written)
    }

    fn take_staged(&mut self, out: &mut [u8]) -> usize {
        let count = (self.staged_end - self.staged_start).min(out.len());
        out[..count].copy_from_slice(&self.staged[self.staged_start..self.staged_start + count]);
        self.staged_start += count;
        count
    }
}
