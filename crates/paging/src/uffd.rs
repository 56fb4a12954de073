//! The userfaultfd calls the pager makes, as raw ioctls on the kernel's ABI
//! (include/uapi/linux/userfaultfd.h). Written by hand because no maintained crate has
//! UFFDIO_MOVE (Linux 6.8) and UFFDIO_POISON (6.6), which eviction and lost pages need, and the
//! whole surface is nine ioctls and one message layout.
//!
//! Every call returns the errno on failure: EAGAIN (an unmap, remove or remap event is pending:
//! read the events, then retry), EEXIST (the page is already there) and ENOENT (the source of a
//! move is gone) are normal answers, not faults.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const UFFDIO: u64 = 0xAA;
const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}
const UFFD_API: u64 = 0xAA;
const UFFDIO_API: u64 = iowr(0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
const UFFDIO_WAKE: u64 = ior(0x02, 16);
const UFFDIO_COPY: u64 = iowr(0x03, 40);
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, 32);
const UFFDIO_MOVE: u64 = iowr(0x05, 40);
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);
const UFFDIO_POISON: u64 = iowr(0x08, 32);

pub const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
pub const FEATURE_EVENT_REMAP: u64 = 1 << 2;
pub const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
pub const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
pub const FEATURE_POISON: u64 = 1 << 14;
pub const FEATURE_MOVE: u64 = 1 << 16;

const REGISTER_MODE_MISSING: u64 = 1;
const REGISTER_MODE_WP: u64 = 2;
const MODE_DONTWAKE: u64 = 1;
const COPY_MODE_WP: u64 = 2;

pub const EVENT_PAGEFAULT: u8 = 0x12;
pub const EVENT_REMAP: u8 = 0x14;
pub const EVENT_REMOVE: u8 = 0x15;
pub const EVENT_UNMAP: u8 = 0x16;
pub const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
pub const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

/// One message read from a userfaultfd (`struct uffd_msg`, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Message {
    pub event: u8,
    reserved: [u8; 7],
    /// pagefault: flags, address, thread id; remap: from, to, len; remove/unmap: start, end.
    pub arg: [u64; 3],
}

#[repr(C)]
struct Range {
    start: u64,
    len: u64,
}

/// A userfaultfd, non-blocking, closed on exec (the new image is left alone).
pub struct Uffd {
    fd: OwnedFd,
    features: u64,
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Uffd {
    /// Opens a userfaultfd that asks for `wanted` features and keeps those the kernel has.
    /// Faults the kernel takes on the process's behalf (a `read(2)` into a registered buffer)
    /// are served too, which needs CAP_SYS_PTRACE (root) where `vm.unprivileged_userfaultfd` is 0.
    pub fn open(wanted: u64) -> io::Result<Uffd> {
        // SAFETY: the syscall takes flags only and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor the kernel just gave us and nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // Ask for nothing first to learn what the kernel has, then for what is wanted of it
        // (the API handshake may be done once per descriptor: open a second one).
        let available = {
            let mut api = [UFFD_API, 0, 0];
            // SAFETY: `api` is the 24-byte `struct uffdio_api` the ioctl reads and writes.
            check(unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, api.as_mut_ptr()) })?;
            api[1]
        };
        drop(fd);
        // SAFETY: as above.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut api = [UFFD_API, wanted & available, 0];
        // SAFETY: as above.
        check(unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, api.as_mut_ptr()) })?;
        Ok(Uffd { fd, features: api[1] })
    }

    pub fn features(&self) -> u64 {
        self.features
    }

    pub fn raw(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    fn ioctl<T>(&self, request: u64, argument: &mut T) -> io::Result<()> {
        // SAFETY: every caller passes the `struct` the request names, laid out as the kernel's.
        check(unsafe { libc::ioctl(self.fd.as_raw_fd(), request as _, argument as *mut T) })
    }

    /// Registers `[start, start + len)` for missing faults, and write-protect faults when
    /// `write_protect`.
    pub fn register(&self, start: u64, len: u64, write_protect: bool) -> io::Result<()> {
        let mode = REGISTER_MODE_MISSING | if write_protect { REGISTER_MODE_WP } else { 0 };
        let mut argument = [start, len, mode, 0];
        self.ioctl(UFFDIO_REGISTER, &mut argument)
    }

    pub fn wake(&self, start: u64, len: u64) -> io::Result<()> {
        self.ioctl(UFFDIO_WAKE, &mut Range { start, len })
    }

    /// Fills the missing page at `dst` with a copy of `src` (a page of this process that is
    /// not registered), write-protected when `write_protect`.
    pub fn copy(&self, dst: u64, src: &[u8], write_protect: bool, wake: bool) -> io::Result<()> {
        let mode = if write_protect { COPY_MODE_WP } else { 0 } | if wake { 0 } else { MODE_DONTWAKE };
        let mut argument = [dst, src.as_ptr() as u64, src.len() as u64, mode, 0];
        self.ioctl(UFFDIO_COPY, &mut argument)
    }

    pub fn zeropage(&self, dst: u64, len: u64) -> io::Result<()> {
        let mut argument = [dst, len, 0, 0];
        self.ioctl(UFFDIO_ZEROPAGE, &mut argument)
    }

    /// Moves the pages at `src` to the missing pages at `dst` (registered with this
    /// descriptor), atomically: `src` is missing afterwards. Never touches the page's bytes.
    pub fn move_pages(&self, dst: u64, src: u64, len: u64, wake: bool) -> io::Result<()> {
        self.move_pages_counted(dst, src, len, wake).1
    }

    /// [`Uffd::move_pages`], with the bytes moved from the start of the range (all of them on
    /// success; on an error, those moved before it).
    pub fn move_pages_counted(&self, dst: u64, src: u64, len: u64, wake: bool) -> (u64, io::Result<()>) {
        let mut argument = [dst, src, len, if wake { 0 } else { MODE_DONTWAKE }, 0];
        let result = self.ioctl(UFFDIO_MOVE, &mut argument);
        let moved = match result {
            Ok(()) => len,
            // The kernel's `move` field: bytes moved, or a negative errno when none were.
            Err(_) => (argument[4] as i64).clamp(0, len as i64) as u64,
        };
        (moved, result)
    }

    /// Lifts write-protection from a present range and wakes its waiting writers. (Pages are
    /// protected only as UFFDIO_COPY installs them: protecting a page afterwards would leave a
    /// moment in which another thread's write is not seen; and the kernel refuses protection
    /// with DONTWAKE, EINVAL.)
    pub fn unprotect(&self, start: u64, len: u64) -> io::Result<()> {
        let mut argument = [start, len, 0];
        self.ioctl(UFFDIO_WRITEPROTECT, &mut argument)
    }

    /// Marks the missing range poisoned: an access gets SIGBUS.
    pub fn poison(&self, start: u64, len: u64) -> io::Result<()> {
        let mut argument = [start, len, 0, 0];
        self.ioctl(UFFDIO_POISON, &mut argument)
    }

    /// Reads up to `messages.len()` pending messages without blocking; 0 when none is pending.
    pub fn read(&self, messages: &mut [Message]) -> io::Result<usize> {
        let bytes = std::mem::size_of_val(messages);
        // SAFETY: `messages` is valid for `bytes` bytes and `Message` is plain old data.
        let got = unsafe { libc::read(self.fd.as_raw_fd(), messages.as_mut_ptr().cast(), bytes) };
        if got < 0 {
            let error = io::Error::last_os_error();
            return if error.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(error) };
        }
        Ok(got as usize / std::mem::size_of::<Message>())
    }
}

/// The errno of an ioctl's failure (0 when it is not an OS error).
pub fn errno(error: &io::Error) -> i32 {
    error.raw_os_error().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_numbers_are_the_kernels() {
        // From the kernel's uapi header, as printed by a C program on this machine's headers.
        assert_eq!(UFFDIO_API, 0xC018_AA3F);
        assert_eq!(UFFDIO_REGISTER, 0xC020_AA00);
        assert_eq!(UFFDIO_COPY, 0xC028_AA03);
        assert_eq!(UFFDIO_WAKE, 0x8010_AA02);
        assert_eq!(std::mem::size_of::<Message>(), 32);
    }
}
