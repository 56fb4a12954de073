//! Cluster-secret authentication (`docs/PROTOCOL.md`, "Authentication").
//!
//! Both sides prove knowledge of the shared secret with HMAC-SHA256 over both nonces and the
//! client id, under distinct labels so a node proof can never be replayed as a client proof.
//!
//! Invariants: the secret is never printed (its `Debug` is redacted) and never comes from the
//! command line; proofs are compared in constant time.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::{Path, PathBuf};

/// Shortest secret accepted.
pub const MIN_SECRET_BYTES: usize = 16;
/// Environment variable read by [`Secret::load`] when no file is given.
pub const SECRET_ENV: &str = "REMEM_SECRET";

const NODE_LABEL: &[u8] = b"remem-node-v1";
const CLIENT_LABEL: &[u8] = b"remem-client-v1";
/// The domain label of the Noise pre-shared key (`encryption`): the key is a keyed hash of this
/// label, never the secret itself, so no cipher ever holds the bytes the proofs are made with.
const NOISE_PSK_LABEL: &[u8] = b"remem-noise-psk-v1";
/// The domain label of [`Secret::cluster_tag`].
const CLUSTER_TAG_LABEL: &[u8] = b"remem-cluster-tag-v1";

/// The cluster secret: at least [`MIN_SECRET_BYTES`] bytes.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret is {len} bytes, at least {min} required", min = MIN_SECRET_BYTES)]
    TooShort { len: usize },
    #[error("cannot read secret file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no secret: give a secret file or set {SECRET_ENV}")]
    Missing,
    #[error(
        "secret file {path} has mode {mode:o}: other users can read it; \
         make it private with `chmod 600 {path}` (and make a new secret if it may have leaked)"
    )]
    Readable { path: PathBuf, mode: u32 },
}

impl Secret {
    /// Fails with [`SecretError::TooShort`] below [`MIN_SECRET_BYTES`].
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Secret, SecretError> {
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort { len: bytes.len() });
        }
        Ok(Secret(bytes))
    }

    /// Loads the secret from `file` if given, else from the `REMEM_SECRET` environment variable.
    /// One trailing newline (`\n` or `\r\n`) is removed, so `echo secret > file` works. A file
    /// that group or other users may read is refused ([`SecretError::Readable`]): whoever reads
    /// the secret can read and write every client's memory.
    pub fn load(file: Option<&Path>) -> Result<Secret, SecretError> {
        let mut bytes = match file {
            Some(path) => {
                use std::os::unix::fs::PermissionsExt;
                let read_error = |source| SecretError::Read { path: path.to_owned(), source };
                let mode = std::fs::metadata(path).map_err(read_error)?.permissions().mode();
                if mode & 0o077 != 0 {
                    return Err(SecretError::Readable { path: path.to_owned(), mode: mode & 0o7777 });
                }
                std::fs::read(path).map_err(read_error)?
            }
            None => {
                use std::os::unix::ffi::OsStringExt;
                std::env::var_os(SECRET_ENV).ok_or(SecretError::Missing)?.into_vec()
            }
        };
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        Secret::from_bytes(bytes)
    }

    fn mac(&self, label: &[u8], client_nonce: &[u8; 32], node_nonce: &[u8; 32], client_id: u64) -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(client_nonce);
        mac.update(node_nonce);
        mac.update(&client_id.to_le_bytes());
        mac.finalize().into_bytes().into()
    }
}

impl Secret {
    /// The Noise pre-shared key of node traffic (`encryption`): `HMAC-SHA256(secret,
    /// "remem-noise-psk-v1")`. Distinct from every proof, which all have 72 more bytes after
    /// their label.
    pub(crate) fn noise_psk(&self) -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(NOISE_PSK_LABEL);
        mac.finalize().into_bytes().into()
    }

    /// A name of the cluster this secret belongs to, safe to write into files: the first 8
    /// bytes of `HMAC-SHA256(secret, "remem-cluster-tag-v1")` in hex. A slab map records it, so
    /// a map saved on another cluster (a new `remem up` makes a new secret) is told apart even
    /// when the new cluster's nodes happen to listen on some of the old ports.
    pub fn cluster_tag(&self) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(CLUSTER_TAG_LABEL);
        let digest: [u8; 32] = mac.finalize().into_bytes().into();
        digest[..8].iter().map(|byte| format!("{byte:02x}")).collect()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        // Best effort: the allocator may have copied the bytes before, but do not leave the last
        // copy lying in freed memory.
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

/// The node's proof: `HMAC-SHA256(secret, "remem-node-v1" || client_nonce || node_nonce || client_id LE)`.
pub fn node_proof(
    secret: &Secret,
    client_nonce: &[u8; 32],
    node_nonce: &[u8; 32],
    client_id: u64,
) -> [u8; 32] {
    secret.mac(NODE_LABEL, client_nonce, node_nonce, client_id)
}

/// The client's proof: `HMAC-SHA256(secret, "remem-client-v1" || client_nonce || node_nonce || client_id LE)`.
pub fn client_proof(
    secret: &Secret,
    client_nonce: &[u8; 32],
    node_nonce: &[u8; 32],
    client_id: u64,
) -> [u8; 32] {
    secret.mac(CLIENT_LABEL, client_nonce, node_nonce, client_id)
}

/// Constant-time equality of two proofs.
pub fn verify(expected: &[u8; 32], got: &[u8; 32]) -> bool {
    use subtle::ConstantTimeEq;
    expected.ct_eq(got).into()
}
