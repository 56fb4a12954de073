//! The server's sockets: a client connection over TCP (plain or TLS) or a Unix socket, and the
//! Unix listener, bound owner-only.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};

use mio::net::{TcpStream, UnixListener, UnixStream};

pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<crate::tls::TlsStream>),
}

impl Stream {
    pub(crate) fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(stream) => stream,
            Stream::Unix(stream) => stream,
            Stream::Tls(stream) => &mut stream.socket,
        }
    }

    /// Bytes accepted by a TLS stream wait in it for a writable socket (never for a plain one).
    pub(crate) fn wants_write(&self) -> bool {
        matches!(self, Stream::Tls(stream) if stream.wants_write())
    }

    /// Sends what a TLS stream holds (`WouldBlock`: some of it still waits).
    pub(crate) fn send_pending(&mut self) -> io::Result<()> {
        match self {
            Stream::Tls(stream) => stream.send_records(),
            _ => Ok(()),
        }
    }

    /// Only the loop's thread may write it: a TLS stream's records come from its rustls state,
    /// which a reply writer does not hold.
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.read(buf),
            Stream::Unix(stream) => stream.read(buf),
            Stream::Tls(stream) => stream.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.write(buf),
            Stream::Unix(stream) => stream.write(buf),
            Stream::Tls(stream) => stream.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.write_vectored(bufs),
            Stream::Unix(stream) => stream.write_vectored(bufs),
            Stream::Tls(stream) => stream.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(stream) => stream.as_fd(),
            Stream::Unix(stream) => stream.as_fd(),
            Stream::Tls(stream) => stream.socket.as_fd(),
        }
    }
}

/// Binds the Unix socket so that it is never open to other users, not even for an instant: it
/// is created under a umask that leaves only the owner (as `remem nbd` does), instead of being
/// made 0600 after the bind, when another user may have connected already.
pub(crate) fn bind_unix_owner_only(path: &std::path::Path) -> io::Result<UnixListener> {
    // SAFETY: umask has no preconditions. It is process-wide: the server binds at start-up,
    // before its metrics thread exists, and no other thread creates files meanwhile (the
    // client's probe threads, if a node is down, only open sockets).
    let previous = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the mask the process had.
    unsafe { libc::umask(previous) };
    let listener = bound?;
    // 0600 exactly, whatever stricter mask the process had.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

pub(crate) fn remove_stale_socket(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}
