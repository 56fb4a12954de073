//! A TLS connection on the server's non-blocking, edge-triggered loop (`--enable-ssl`, as
//! memcached's `-Z`): rustls's `ServerConnection` over a mio `TcpStream`, read and written as
//! the plain sockets are.
//!
//! rustls is sans-I/O, so this is the glue between it and the socket; no crate does it for a
//! mio loop (tokio-rustls needs tokio). The loop's contracts hold:
//! - **A short read means the socket is drained.** The loop stops reading a connection after a
//!   read that did not fill its buffer (edge-triggered epoll brings an event for the next
//!   bytes), so [`TlsStream::read`] fills the buffer from decrypted bytes and the socket until
//!   the buffer is full or the socket would block. Decrypted bytes left over stay in rustls; a
//!   full read makes the loop read again, and a paused connection's resume reads too.
//! - **Output accepted is output on its way.** [`TlsStream::write_vectored`] first sends the
//!   records rustls holds; only when none wait does it take more plaintext. So bytes it
//!   accepted may wait in rustls for a writable socket: [`TlsStream::wants_write`] tells the
//!   loop to keep the connection's writable interest (and not to close it) until they are out.
//! - Handshake records go out as soon as reading produced them, or wait as above.

use std::io::{self, IoSlice, Read, Write};
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::{ServerConfig, ServerConnection};

pub(crate) struct TlsStream {
    pub(crate) socket: TcpStream,
    tls: ServerConnection,
}

impl TlsStream {
    pub(crate) fn new(socket: TcpStream, config: &Arc<ServerConfig>) -> io::Result<TlsStream> {
        let tls = ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
        Ok(TlsStream { socket, tls })
    }

    /// Records (handshake or data) wait for the socket.
    pub(crate) fn wants_write(&self) -> bool {
        self.tls.wants_write()
    }

    /// Sends what rustls holds. `WouldBlock` when some of it must wait for a writable socket.
    pub(crate) fn send_records(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.socket) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Reads records from the socket into rustls and decrypts them. `Ok(false)` at the end of
    /// the stream; a bad record (or handshake) is an error, and closes the connection.
    fn receive_records(&mut self) -> io::Result<bool> {
        loop {
            match self.tls.read_tls(&mut self.socket) {
                Ok(0) => return Ok(false),
                Ok(_) => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        if let Err(error) = self.tls.process_new_packets() {
            // Tell the peer why (an alert), best effort, then fail the connection.
            let _ = self.send_records();
            return Err(io::Error::new(io::ErrorKind::InvalidData, error));
        }
        // Handshake answers, key updates: out now, or when the socket is writable.
        match self.send_records() {
            Err(error) if error.kind() != io::ErrorKind::WouldBlock => Err(error),
            _ => Ok(true),
        }
    }
}

impl Read for TlsStream {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        loop {
            match self.tls.reader().read(&mut buffer[filled..]) {
                // The peer's close_notify: what was read is the last.
                Ok(0) if filled < buffer.len() => return Ok(filled),
                Ok(read) => filled += read,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
            if filled == buffer.len() {
                return Ok(filled);
            }
            match self.receive_records() {
                Ok(true) => {}
                // The socket closed without close_notify: what was read, then the end.
                Ok(false) => return Ok(filled),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock && filled > 0 => return Ok(filled),
                Err(error) => return Err(error),
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buffer)])
    }

    fn write_vectored(&mut self, buffers: &[IoSlice<'_>]) -> io::Result<usize> {
        // Records still waiting: nothing more is taken until they are out.
        self.send_records()?;
        let taken = self.tls.writer().write_vectored(buffers)?;
        match self.send_records() {
            Err(error) if error.kind() != io::ErrorKind::WouldBlock => Err(error),
            _ => Ok(taken),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
