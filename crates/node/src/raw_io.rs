//! Socket I/O on raw memory: `recv` into a slot and `sendmsg` from slots, so that split payloads
//! move between the socket and slab memory without a user-space copy and without Rust references
//! to memory other threads may be writing (see `slab` module docs).

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Receives exactly `len` bytes into `dst`. Honours the socket's read timeout.
///
/// # Safety
/// `dst..dst + len` must be valid for writes for the whole call, and no Rust reference may
/// observe those bytes during it.
pub unsafe fn recv_exact(stream: &TcpStream, dst: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        // SAFETY: the caller guarantees dst..dst+len is writable; done < len keeps the range
        // dst+done..dst+len inside it.
        let n = unsafe { libc::recv(stream.as_raw_fd(), dst.add(done).cast(), len - done, 0) };
        match n {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => done += n as usize,
            _ => {
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
    Ok(())
}

/// Sends every byte described by `iovecs`, advancing them as it goes (they are consumed).
/// Uses `MSG_NOSIGNAL` so a vanished peer is an error, not a SIGPIPE. Honours the write timeout.
///
/// # Safety
/// Every iovec must describe memory valid for reads for the whole call.
pub unsafe fn send_all(stream: &TcpStream, mut iovecs: &mut [libc::iovec]) -> io::Result<()> {
    while !iovecs.is_empty() {
        if iovecs[0].iov_len == 0 {
            iovecs = &mut std::mem::take(&mut iovecs)[1..];
            continue;
        }
        // SAFETY: an all-zero msghdr is a valid empty message; we then point it at our iovecs.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = iovecs.as_mut_ptr();
        message.msg_iovlen = iovecs.len().min(libc::UIO_MAXIOV as usize) as _;
        // SAFETY: the message points at `msg_iovlen` live iovecs whose memory the caller
        // guarantees is readable; sendmsg only reads it.
        let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &message, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        let mut sent = n as usize;
        while sent > 0 {
            let first = &mut iovecs[0];
            if sent >= first.iov_len {
                sent -= first.iov_len;
                iovecs = &mut std::mem::take(&mut iovecs)[1..];
            } else {
                // SAFETY: sent < iov_len, so the advanced base stays inside the same buffer.
                first.iov_base = unsafe { first.iov_base.cast::<u8>().add(sent).cast() };
                first.iov_len -= sent;
                sent = 0;
            }
        }
    }
    Ok(())
}

/// An iovec over `len` bytes at `ptr`, for [`send_all`].
pub fn iovec(ptr: *const u8, len: usize) -> libc::iovec {
    libc::iovec { iov_base: ptr.cast_mut().cast(), iov_len: len }
}
