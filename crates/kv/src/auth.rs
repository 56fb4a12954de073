//! memcached's ASCII authentication (memcached `-Y`): a connection's first command must be a
//! `set` whose data is `<user> <password>`; until then every command is answered
//! `CLIENT_ERROR unauthenticated`. The credentials file has one `user:password` per line and must
//! not be readable by group or others. This keeps other local users (and anyone who can reach a
//! TCP port) out of the cache; it does not hide the password on the wire (memcached's TLS is not
//! offered: use the Unix socket on one host, a tunnel across hosts; docs/KV.md).

use std::path::Path;

use remem_memcache::{Request, StoreMode};
use subtle::ConstantTimeEq;

pub const STORED: &[u8] = b"STORED\r\n";
const FAILED: &[u8] = b"CLIENT_ERROR authentication failure\r\n";
const UNAUTHENTICATED: &[u8] = b"CLIENT_ERROR unauthenticated\r\n";

/// The users and passwords of an auth file.
#[derive(Clone, Debug)]
pub struct Credentials {
    users: Vec<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is readable by group or others (mode {mode:o}): chmod 600 it")]
    Readable { path: String, mode: u32 },
    #[error("{path} line {line}: expected user:password")]
    Format { path: String, line: usize },
    #[error("{path} has no user")]
    Empty { path: String },
}

impl Credentials {
    pub fn load(path: &Path) -> Result<Credentials, AuthFileError> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display().to_string();
        let metadata =
            std::fs::metadata(path).map_err(|source| AuthFileError::Read { path: shown.clone(), source })?;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(AuthFileError::Readable { path: shown, mode });
        }
        let text =
            std::fs::read(path).map_err(|source| AuthFileError::Read { path: shown.clone(), source })?;
        Credentials::parse(&text).map_err(|error| match error {
            AuthFileError::Format { line, .. } => AuthFileError::Format { path: shown.clone(), line },
            _ => AuthFileError::Empty { path: shown.clone() },
        })
    }

    pub fn parse(text: &[u8]) -> Result<Credentials, AuthFileError> {
        let mut users = Vec::new();
        for (index, line) in text.split(|&byte| byte == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            match line.iter().position(|&byte| byte == b':') {
                Some(at) if at > 0 && at + 1 < line.len() => {
                    users.push((line[..at].to_vec(), line[at + 1..].to_vec()))
                }
                _ => return Err(AuthFileError::Format { path: String::new(), line: index + 1 }),
            }
        }
        if users.is_empty() {
            return Err(AuthFileError::Empty { path: String::new() });
        }
        Ok(Credentials { users })
    }

    /// Whether `user password` names a user of the file (compared in constant time).
    fn accepts(&self, data: &[u8]) -> bool {
        let Some(space) = data.iter().position(|&byte| byte == b' ') else { return false };
        let (user, password) = (&data[..space], &data[space + 1..]);
        let mut found = false;
        for (known_user, known_password) in &self.users {
            found |= bool::from(known_user.ct_eq(user) & known_password.ct_eq(password));
        }
        found
    }
}

/// The answer to a request on a connection not authenticated yet, and whether to close it.
pub fn authenticate(credentials: &Credentials, request: &Request<'_>) -> (&'static [u8], bool) {
    match request {
        Request::Store { mode: StoreMode::Set, data, .. } if credentials.accepts(data) => (STORED, false),
        Request::Store { mode: StoreMode::Set, .. } => (FAILED, false),
        Request::Quit => (b"", true),
        _ => (UNAUTHENTICATED, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(data: &'static [u8]) -> Request<'static> {
        Request::Store {
            mode: StoreMode::Set,
            key: std::borrow::Cow::Borrowed(b"auth"),
            flags: 0,
            exptime: 0,
            data,
            cas_unique: 0,
            noreply: false,
        }
    }

    #[test]
    fn only_a_set_with_a_known_user_and_password_authenticates() {
        let credentials = Credentials::parse(b"alice:secret one\nbob:pw\n").unwrap();
        assert_eq!(authenticate(&credentials, &set(b"alice secret one")).0, STORED);
        assert_eq!(authenticate(&credentials, &set(b"bob pw")).0, STORED);
        assert_eq!(authenticate(&credentials, &set(b"bob pwx")).0, FAILED);
        assert_eq!(authenticate(&credentials, &set(b"alice")).0, FAILED);
        assert_eq!(authenticate(&credentials, &Request::Version).0, UNAUTHENTICATED);
        assert!(Credentials::parse(b"nocolon\n").is_err());
        assert!(Credentials::parse(b"\n").is_err());
    }
}
