//! Blocking frame I/O over `std::io::Read`/`Write`, for control paths, tools and tests.
//!
//! Invariant: a body is read only after its header decoded, so its length is within the kind's
//! bound and at most `MAX_BODY_BYTES`.

use crate::auth::{self, Secret};
use crate::sizes::HEADER_BYTES;
use crate::{Control, DecodeError, ErrorCode, FrameHeader, Kind};
use std::io::{self, Read, Write};

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed by peer")]
    Closed,
    #[error("frame I/O failed")]
    Io(#[from] io::Error),
    #[error("malformed frame")]
    Decode(#[from] DecodeError),
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("handshake frame failed")]
    Frame(#[from] FrameError),
    #[error("node rejected the handshake: {code}: {message}")]
    Rejected { code: ErrorCode, message: String },
    #[error("node proof does not match: the node does not hold our secret")]
    NodeProofMismatch,
    #[error("unexpected {kind:?} during the handshake")]
    Unexpected { kind: Kind },
}

/// Encodes `msg` and writes the whole frame.
pub fn write_control(w: &mut impl Write, request_id: u64, msg: &Control) -> io::Result<()> {
    let mut frame = Vec::with_capacity(64);
    msg.encode(request_id, &mut frame);
    w.write_all(&frame)
}

/// Reads and validates one header. A clean end of stream before its first byte is
/// [`FrameError::Closed`]; inside it, an `UnexpectedEof` I/O error.
pub fn read_header(r: &mut impl Read) -> Result<FrameHeader, FrameError> {
    let mut bytes = [0u8; HEADER_BYTES];
    let mut filled = 0;
    while filled < HEADER_BYTES {
        match r.read(&mut bytes[filled..]) {
            Ok(0) if filled == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(FrameHeader::decode(&bytes)?)
}

/// Reads one whole frame: the validated header, and its body into `body` (replacing its
/// contents; the buffer is reused, so steady-state reads do not allocate).
pub fn read_frame(r: &mut impl Read, body: &mut Vec<u8>) -> Result<FrameHeader, FrameError> {
    let header = read_header(r)?;
    // Resized, not cleared first: zeroing what `read_exact` overwrites cost a rebuild a memset
    // of every 135 KB batch.
    body.resize(header.body_len as usize, 0);
    r.read_exact(body)?;
    Ok(header)
}

/// Reads one frame and decodes it as a control message; a payload kind is
/// [`DecodeError::NotControl`].
pub fn read_control(r: &mut impl Read, body: &mut Vec<u8>) -> Result<(FrameHeader, Control), FrameError> {
    let header = read_frame(r, body)?;
    let control = Control::decode_body(header.kind, body)?;
    Ok((header, control))
}

/// The handshake of a tool acting for `client_id` without claiming it (session 0): it reaches
/// the slabs of whichever session holds the id, and never keeps their lease alive.
pub fn handshake(
    stream: &mut (impl Read + Write),
    secret: &Secret,
    client_id: u64,
) -> Result<u64, HandshakeError> {
    handshake_session(stream, secret, client_id, 0)
}

/// The client side of the handshake: Hello, check the node's proof, Auth, AuthOk.
/// Returns the node id. Uses request ids 0 and 1. A nonzero `session` claims `client_id` on the
/// node (`Control::Hello`).
///
/// Errors: [`HandshakeError::NodeProofMismatch`] if the node does not hold `secret` (no proof of
/// ours is sent then), [`HandshakeError::Rejected`] if the node refuses ours or another live
/// session holds the id (`ErrorCode::ClientIdInUse`).
pub fn handshake_session(
    stream: &mut (impl Read + Write),
    secret: &Secret,
    client_id: u64,
    session: u64,
) -> Result<u64, HandshakeError> {
    let client_nonce: [u8; 32] = rand::random();
    write_control(stream, 0, &Control::Hello { client_id, client_nonce, session })
        .map_err(FrameError::from)?;
    let mut body = Vec::with_capacity(128);
    let node_nonce = match read_control(stream, &mut body)?.1 {
        Control::Challenge { node_nonce, node_proof } => {
            let expected = auth::node_proof(secret, &client_nonce, &node_nonce, client_id);
            if !auth::verify(&expected, &node_proof) {
                return Err(HandshakeError::NodeProofMismatch);
            }
            node_nonce
        }
        Control::Error { code, message } => return Err(HandshakeError::Rejected { code, message }),
        other => return Err(HandshakeError::Unexpected { kind: other.kind() }),
    };
    let client_proof = auth::client_proof(secret, &client_nonce, &node_nonce, client_id);
    write_control(stream, 1, &Control::Auth { client_proof }).map_err(FrameError::from)?;
    match read_control(stream, &mut body)?.1 {
        Control::AuthOk { node_id } => Ok(node_id),
        Control::Error { code, message } => Err(HandshakeError::Rejected { code, message }),
        other => Err(HandshakeError::Unexpected { kind: other.kind() }),
    }
}
