//! A connection's socket: TCP, or a Unix socket on the same host. The protocol is the same on
//! both; only a Unix connection can carry a file descriptor, which `ExportSlab` needs to hand a
//! slab's memfd to its owner (`docs/SHM.md`).

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(stream) => Stream::Tcp(stream.try_clone()?),
            Stream::Unix(stream) => Stream::Unix(stream.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.shutdown(how),
            Stream::Unix(stream) => stream.shutdown(how),
        }
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.set_read_timeout(timeout),
            Stream::Unix(stream) => stream.set_read_timeout(timeout),
        }
    }

    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.set_write_timeout(timeout),
            Stream::Unix(stream) => stream.set_write_timeout(timeout),
        }
    }

    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.set_nonblocking(nonblocking),
            Stream::Unix(stream) => stream.set_nonblocking(nonblocking),
        }
    }

    pub fn is_unix(&self) -> bool {
        matches!(self, Stream::Unix(_))
    }

    /// Writes `frame` with `fd` attached to its first byte (SCM_RIGHTS), then the rest of the
    /// frame if the kernel took only part of it. Only on a Unix connection.
    pub fn send_with_fd(&self, frame: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
        let Stream::Unix(stream) = self else {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "file descriptors need a Unix socket"));
        };
        assert!(!frame.is_empty());
        let raw_fd = fd.as_raw_fd();
        let mut iov = [IoSlice::new(frame)];
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
        let mut control = [0u64; 4];
        assert!(space <= std::mem::size_of_val(&control));
        // SAFETY: an all-zero msghdr is valid; its pointers are set below to live buffers.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = iov.as_mut_ptr().cast();
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` zeroed, 8-aligned bytes, enough for one cmsghdr
        // with one int, so CMSG_FIRSTHDR is non-null and CMSG_DATA lies within the buffer.
        let sent = unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            assert!(!header.is_null());
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), raw_fd);
            libc::sendmsg(stream.as_raw_fd(), &message, libc::MSG_NOSIGNAL)
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        (&*stream).write_all(&frame[sent as usize..])
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => (&*stream).read(buf),
            Stream::Unix(stream) => (&*stream).read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => (&*stream).write(buf),
            Stream::Unix(stream) => (&*stream).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
