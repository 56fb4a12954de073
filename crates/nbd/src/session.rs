//! One connection's byte stream through its life: plain, under one deadline for the whole
//! handshake, upgraded to TLS if the client sends STARTTLS, then handed to the transmission
//! phase with no deadline (clients legitimately stay quiet there for hours).
//!
//! Why a deadline and not a timeout per read: a client dripping one byte every few seconds
//! would reset a per-read timeout for ever and hold its handshake slot; a deadline ends it.
//! The TLS handshake runs inside the same deadline (rustls reads and writes through
//! [`Deadlined`]).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::{ServerConnection, StreamOwned};

use crate::error::ConnectionError;
use crate::handshake::{greet, haggle, HandshakeOutcome, Negotiated, Tls};
use crate::server::{ServerConfig, Stream};
use crate::transmission::Socket;

/// A stream whose every read and write must finish before one deadline, if it has one.
pub struct Deadlined {
    stream: Stream,
    deadline: Option<Instant>,
}

impl Deadlined {
    fn arm(&self) -> io::Result<()> {
        let Some(deadline) = self.deadline else { return Ok(()) };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the handshake deadline passed"));
        }
        self.stream.set_timeouts(left, left)
    }

    /// No deadline from now on; single reads and writes may block up to `timeout`.
    fn end_deadline(&mut self, timeout: Duration) -> io::Result<()> {
        self.deadline = None;
        self.stream.set_timeouts(timeout, timeout)
    }
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        self.stream.read(buf)
    }
}

impl Write for Deadlined {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connection in transmission: plain or TLS.
pub enum Session {
    Plain(Deadlined),
    Tls(Box<StreamOwned<ServerConnection, Deadlined>>),
}

impl Session {
    fn deadlined(&mut self) -> &mut Deadlined {
        match self {
            Session::Plain(stream) => stream,
            Session::Tls(stream) => &mut stream.sock,
        }
    }
}

impl Read for Session {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Session::Plain(stream) => stream.read(buf),
            Session::Tls(stream) => stream.read(buf),
        }
    }
}

impl Write for Session {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Session::Plain(stream) => stream.write(buf),
            Session::Tls(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Session::Plain(stream) => stream.flush(),
            Session::Tls(stream) => stream.flush(),
        }
    }
}

impl Socket for Session {
    fn raw_fd(&self) -> RawFd {
        match self {
            Session::Plain(stream) => stream.stream.as_raw_fd(),
            Session::Tls(stream) => stream.sock.stream.as_raw_fd(),
        }
    }

    /// Decrypted bytes rustls holds are invisible to `poll` on the socket.
    fn input_buffered(&mut self) -> bool {
        match self {
            Session::Plain(_) => false,
            // An error is reported by the next read; say there is something to read.
            Session::Tls(stream) => {
                stream.conn.process_new_packets().map_or(true, |state| state.plaintext_bytes_to_read() > 0)
            }
        }
    }
}

/// Runs the handshake on `stream` within `config.handshake_timeout`, with TLS as
/// `config.tls` says. Returns the session and what it negotiated, or `None` if the client
/// left before transmission. `admit` takes a transmission slot (see [`haggle`]).
pub fn handshake(
    stream: Stream,
    config: &ServerConfig,
    admit: &dyn Fn() -> bool,
) -> Result<Option<(Session, Negotiated)>, ConnectionError> {
    let mut plain = Deadlined { stream, deadline: Some(Instant::now() + config.handshake_timeout) };
    let tls = match &config.tls {
        Some(settings) => Tls::Offered { required: settings.required },
        None => Tls::Off,
    };
    let mut haggling = greet(&mut plain, tls)?;
    let (mut session, outcome) = match haggle(&mut plain, &config.export, &mut haggling, admit)? {
        HandshakeOutcome::StartTls => {
            let settings = config.tls.as_ref().expect("STARTTLS is acknowledged only when TLS is offered");
            let connection =
                ServerConnection::new(Arc::clone(&settings.config)).map_err(ConnectionError::Tls)?;
            let mut secure = StreamOwned::new(connection, plain);
            let outcome = haggle(&mut secure, &config.export, &mut haggling, admit)?;
            (Session::Tls(Box::new(secure)), outcome)
        }
        outcome => (Session::Plain(plain), outcome),
    };
    match outcome {
        HandshakeOutcome::Transmission(negotiated) => {
            session.deadlined().end_deadline(config.reply_timeout)?;
            Ok(Some((session, negotiated)))
        }
        HandshakeOutcome::Ended => Ok(None),
        HandshakeOutcome::StartTls => unreachable!("STARTTLS is refused once TLS is active"),
    }
}
