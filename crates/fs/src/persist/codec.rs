//! Little-endian encoding of metadata values, and a decoder that treats its input as hostile.
//!
//! Invariants: every read is bounds-checked and returns `DecodeError` instead of panicking;
//! nothing is allocated from a length before that length is checked against a limit and
//! against the bytes actually left; a name or a symlink target is checked for its length here,
//! everything else (inode numbers, page ranges) by the caller that knows what is valid.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::{Duration, SystemTime};

/// Why bytes read back do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("truncated: {wanted} bytes wanted at offset {offset}, {left} left")]
    Truncated { offset: usize, wanted: usize, left: usize },
    #[error("{what} of {len} bytes is longer than {max}")]
    TooLong { what: &'static str, len: u64, max: u64 },
    #[error("bad value: {0}")]
    Bad(String),
}

/// Appends values to a byte vector.
#[derive(Default)]
pub struct Encoder {
    pub bytes: Vec<u8>,
}

impl Encoder {
    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    pub fn u16(&mut self, value: u16) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn bool(&mut self, value: bool) {
        self.u8(value as u8);
    }

    /// A time as signed nanoseconds since the epoch (i128 would be exact for all of
    /// `SystemTime`; i64 seconds + u32 nanoseconds covers every time a kernel can set).
    pub fn time(&mut self, time: SystemTime) {
        let (seconds, nanos) = match time.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(after) => (after.as_secs() as i64, after.subsec_nanos()),
            Err(before) => {
                let before = before.duration();
                if before.subsec_nanos() == 0 {
                    (-(before.as_secs() as i64), 0)
                } else {
                    (-(before.as_secs() as i64) - 1, 1_000_000_000 - before.subsec_nanos())
                }
            }
        };
        self.u64(seconds as u64);
        self.u32(nanos);
    }

    pub fn optional_time(&mut self, time: Option<SystemTime>) {
        self.bool(time.is_some());
        if let Some(time) = time {
            self.time(time);
        }
    }

    /// A name or target: u16 length, then the bytes.
    pub fn name(&mut self, name: &OsStr) {
        let bytes = name.as_bytes();
        self.u16(u16::try_from(bytes.len()).expect("names and targets are at most 4096 bytes"));
        self.bytes.extend_from_slice(bytes);
    }
}

/// Reads values from a byte slice, every read checked.
pub struct Decoder<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8]) -> Decoder<'a> {
        Decoder { bytes, offset: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.offset
    }

    pub fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        if len > self.remaining() {
            return Err(DecodeError::Truncated { offset: self.offset, wanted: len, left: self.remaining() });
        }
        let slice = &self.bytes[self.offset..self.offset + len];
        self.offset += len;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().expect("take returned N bytes"))
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::Bad(format!("boolean byte {other}"))),
        }
    }

    pub fn time(&mut self) -> Result<SystemTime, DecodeError> {
        let seconds = self.u64()? as i64;
        let nanos = self.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(DecodeError::Bad(format!("{nanos} nanoseconds")));
        }
        let time = if seconds >= 0 {
            SystemTime::UNIX_EPOCH.checked_add(Duration::new(seconds as u64, nanos))
        } else {
            SystemTime::UNIX_EPOCH
                .checked_sub(Duration::from_secs(seconds.unsigned_abs()))
                .and_then(|time| time.checked_add(Duration::from_nanos(u64::from(nanos))))
        };
        time.ok_or_else(|| DecodeError::Bad(format!("time {seconds}.{nanos:09} out of range")))
    }

    pub fn optional_time(&mut self) -> Result<Option<SystemTime>, DecodeError> {
        Ok(if self.bool()? { Some(self.time()?) } else { None })
    }

    /// A name or target of at most `max` bytes (checked before anything is allocated).
    pub fn name(&mut self, what: &'static str, max: usize) -> Result<OsString, DecodeError> {
        let len = usize::from(self.u16()?);
        if len > max {
            return Err(DecodeError::TooLong { what, len: len as u64, max: max as u64 });
        }
        Ok(OsString::from_vec(self.take(len)?.to_vec()))
    }

    /// A count of items of at least `min_item_bytes` each: refused if the bytes left cannot
    /// hold them, so a caller may loop over it (it still never pre-allocates from it).
    pub fn count(&mut self, what: &'static str, min_item_bytes: usize) -> Result<u64, DecodeError> {
        let count = self.u64()?;
        let most = (self.remaining() / min_item_bytes.max(1)) as u64;
        if count > most {
            return Err(DecodeError::TooLong { what, len: count, max: most });
        }
        Ok(count)
    }

    pub fn finish(&self, what: &'static str) -> Result<(), DecodeError> {
        if self.remaining() != 0 {
            return Err(DecodeError::Bad(format!("{} bytes left over after {what}", self.remaining())));
        }
        Ok(())
    }
}
