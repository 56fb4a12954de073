//! Journal records: one metadata change each, framed with a length and a CRC32C.
//!
//! Frame: `len: u32 LE | crc: u32 LE | payload (len bytes)`, `crc = crc32c(len bytes ++
//! payload)`; payload: `seq: u64 | tag: u8 | fields`. A record is at most `MAX_RECORD_BYTES`.
//!
//! Fault model: the journal is appended by one process with one `write(2)` per request; a crash
//! (SIGKILL, host crash) may leave the last append cut short or followed by garbage, never
//! damage what was before it. So [`decode_journal`] accepts a bad frame at the tail (reported
//! as `TornTail`) only when fewer than one largest frame of bytes follow it and no whole frame
//! can be found in them; any other bad frame, and any frame whose CRC holds but whose payload
//! does not decode, is corruption and an error. Decoding is total: no input panics, nothing is
//! allocated from a length before it is checked (see `codec`).

use std::ffi::OsString;
use std::time::SystemTime;

use super::codec::{DecodeError, Decoder, Encoder};
use crate::namespace::{FileKind, MAX_NAME_BYTES, MAX_SYMLINK_BYTES};

/// Frame header: length and CRC.
pub const FRAME_HEADER_BYTES: usize = 8;
/// Largest payload: a rename of two 255-byte names, a 4 KiB symlink target, or
/// `MAX_RUNS_PER_RECORD` runs, with room to spare.
pub const MAX_RECORD_BYTES: usize = 12 << 10;
/// Runs of one `Allocate` record (a larger allocation is several records).
pub const MAX_RUNS_PER_RECORD: usize = 256;
/// The largest journal read back (compaction keeps it far smaller).
pub const MAX_JOURNAL_BYTES: u64 = 1 << 30;

/// A run of pages: file pages `file_page..file_page + len` map to remem pages `remote..`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub file_page: u64,
    pub remote: u64,
    pub len: u64,
}

/// One metadata change. Each names every value it sets, times included, so replay does not
/// depend on the clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Create {
        parent: u64,
        name: OsString,
        inode: u64,
        kind: FileKind,
        mode: u16,
        uid: u32,
        gid: u32,
        time: SystemTime,
        /// Symbolic links only.
        target: Option<OsString>,
        /// Character and block devices only (0 for every other kind).
        rdev: u32,
    },
    Link {
        inode: u64,
        parent: u64,
        name: OsString,
        time: SystemTime,
    },
    Unlink {
        parent: u64,
        name: OsString,
        time: SystemTime,
    },
    Rmdir {
        parent: u64,
        name: OsString,
        time: SystemTime,
    },
    Rename {
        parent: u64,
        name: OsString,
        new_parent: u64,
        new_name: OsString,
        no_replace: bool,
        exchange: bool,
        time: SystemTime,
    },
    SetAttributes {
        inode: u64,
        mode: Option<u16>,
        uid: Option<u32>,
        gid: Option<u32>,
        atime: Option<SystemTime>,
        mtime: Option<SystemTime>,
        ctime: SystemTime,
    },
    /// Size set; pages past the new end freed.
    Truncate {
        inode: u64,
        size_bytes: u64,
        time: SystemTime,
    },
    /// File pages `first_page..end_page` hold written data now; the size and times are set.
    Write {
        inode: u64,
        size_bytes: u64,
        time: SystemTime,
        first_page: u64,
        end_page: u64,
    },
    /// Remem pages mapped to the file and not written yet (they read as zeros); with a new
    /// size and time when the allocation changed them.
    Allocate {
        inode: u64,
        runs: Vec<Run>,
        size_bytes: u64,
        time: Option<SystemTime>,
    },
    /// File pages `first_page..end_page` lose their remem pages.
    Punch {
        inode: u64,
        first_page: u64,
        end_page: u64,
        time: SystemTime,
    },
    /// An inode without a name lost its last open handle: it is gone, its pages freed.
    Release {
        inode: u64,
    },
    /// Times changed lazily (by writes that changed nothing else), flushed.
    Times {
        inode: u64,
        atime: SystemTime,
        mtime: SystemTime,
        ctime: SystemTime,
    },
}

const CREATE: u8 = 1;
const LINK: u8 = 2;
const UNLINK: u8 = 3;
const RMDIR: u8 = 4;
const RENAME: u8 = 5;
const SET_ATTRIBUTES: u8 = 6;
const TRUNCATE: u8 = 7;
const WRITE: u8 = 8;
const ALLOCATE: u8 = 9;
const PUNCH: u8 = 10;
const RELEASE: u8 = 11;
const TIMES: u8 = 12;
/// A `Create` of a FIFO, device or socket, with its device number. Files, directories and
/// symlinks keep the tag `CREATE` and its fields, so journals written before special files
/// existed replay unchanged; a binary from before then refuses a journal with special files
/// (`record tag 13`) instead of misreading it.
const CREATE_SPECIAL: u8 = 13;

pub(crate) fn encode_kind(kind: FileKind) -> u8 {
    match kind {
        FileKind::File => 1,
        FileKind::Directory => 2,
        FileKind::Symlink => 3,
        FileKind::Fifo => 4,
        FileKind::CharDevice => 5,
        FileKind::BlockDevice => 6,
        FileKind::Socket => 7,
    }
}

pub(crate) fn decode_kind(byte: u8) -> Result<FileKind, DecodeError> {
    match byte {
        1 => Ok(FileKind::File),
        2 => Ok(FileKind::Directory),
        3 => Ok(FileKind::Symlink),
        4 => Ok(FileKind::Fifo),
        5 => Ok(FileKind::CharDevice),
        6 => Ok(FileKind::BlockDevice),
        7 => Ok(FileKind::Socket),
        other => Err(DecodeError::Bad(format!("file kind {other}"))),
    }
}

fn optional_u32(encoder: &mut Encoder, value: Option<u32>) {
    encoder.bool(value.is_some());
    encoder.u32(value.unwrap_or(0));
}

fn decode_optional_u32(decoder: &mut Decoder) -> Result<Option<u32>, DecodeError> {
    let present = decoder.bool()?;
    let value = decoder.u32()?;
    Ok(present.then_some(value))
}

impl Record {
    /// A `Create` record's tag and fields (`CREATE_SPECIAL` for FIFOs, devices and sockets).
    fn encode_create(&self, encoder: &mut Encoder) {
        let Record::Create { parent, name, inode, kind, mode, uid, gid, time, target, rdev } = self else {
            unreachable!("only a Create is encoded here")
        };
        encoder.u8(if kind.is_special() { CREATE_SPECIAL } else { CREATE });
        encoder.u64(*parent);
        encoder.name(name);
        encoder.u64(*inode);
        encoder.u8(encode_kind(*kind));
        encoder.u16(*mode);
        encoder.u32(*uid);
        encoder.u32(*gid);
        encoder.time(*time);
        if kind.is_special() {
            encoder.u32(*rdev);
        } else {
            assert_eq!(*rdev, 0, "only special files have a device number");
            encoder.bool(target.is_some());
            if let Some(target) = target {
                encoder.name(target);
            }
        }
    }

    fn encode_payload(&self, seq: u64, encoder: &mut Encoder) {
        encoder.u64(seq);
        match self {
            Record::Create { .. } => self.encode_create(encoder),
            Record::Link { inode, parent, name, time } => {
                encoder.u8(LINK);
                encoder.u64(*inode);
                encoder.u64(*parent);
                encoder.name(name);
                encoder.time(*time);
            }
            Record::Unlink { parent, name, time } | Record::Rmdir { parent, name, time } => {
                encoder.u8(if matches!(self, Record::Unlink { .. }) { UNLINK } else { RMDIR });
                encoder.u64(*parent);
                encoder.name(name);
                encoder.time(*time);
            }
            Record::Rename { parent, name, new_parent, new_name, no_replace, exchange, time } => {
                encoder.u8(RENAME);
                encoder.u64(*parent);
                encoder.name(name);
                encoder.u64(*new_parent);
                encoder.name(new_name);
                encoder.bool(*no_replace);
                encoder.bool(*exchange);
                encoder.time(*time);
            }
            Record::SetAttributes { inode, mode, uid, gid, atime, mtime, ctime } => {
                encoder.u8(SET_ATTRIBUTES);
                encoder.u64(*inode);
                optional_u32(encoder, mode.map(u32::from));
                optional_u32(encoder, *uid);
                optional_u32(encoder, *gid);
                encoder.optional_time(*atime);
                encoder.optional_time(*mtime);
                encoder.time(*ctime);
            }
            Record::Truncate { inode, size_bytes, time } => {
                encoder.u8(TRUNCATE);
                encoder.u64(*inode);
                encoder.u64(*size_bytes);
                encoder.time(*time);
            }
            Record::Write { inode, size_bytes, time, first_page, end_page } => {
                encoder.u8(WRITE);
                encoder.u64(*inode);
                encoder.u64(*size_bytes);
                encoder.time(*time);
                encoder.u64(*first_page);
                encoder.u64(*end_page);
            }
            Record::Allocate { inode, runs, size_bytes, time } => {
                assert!(runs.len() <= MAX_RUNS_PER_RECORD, "{} runs in one record", runs.len());
                encoder.u8(ALLOCATE);
                encoder.u64(*inode);
                encoder.u64(*size_bytes);
                encoder.optional_time(*time);
                encoder.u64(runs.len() as u64);
                for run in runs {
                    encoder.u64(run.file_page);
                    encoder.u64(run.remote);
                    encoder.u64(run.len);
                }
            }
            Record::Punch { inode, first_page, end_page, time } => {
                encoder.u8(PUNCH);
                encoder.u64(*inode);
                encoder.u64(*first_page);
                encoder.u64(*end_page);
                encoder.time(*time);
            }
            Record::Release { inode } => {
                encoder.u8(RELEASE);
                encoder.u64(*inode);
            }
            Record::Times { inode, atime, mtime, ctime } => {
                encoder.u8(TIMES);
                encoder.u64(*inode);
                encoder.time(*atime);
                encoder.time(*mtime);
                encoder.time(*ctime);
            }
        }
    }

    /// Appends the framed record with sequence number `seq` to `out`.
    pub fn encode(&self, seq: u64, out: &mut Vec<u8>) {
        let mut encoder = Encoder::default();
        self.encode_payload(seq, &mut encoder);
        let payload = encoder.bytes;
        assert!(
            !payload.is_empty() && payload.len() <= MAX_RECORD_BYTES,
            "record of {} bytes",
            payload.len()
        );
        let len = (payload.len() as u32).to_le_bytes();
        let crc = crc32c::crc32c_append(crc32c::crc32c(&len), &payload);
        out.extend_from_slice(&len);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&payload);
    }

    /// Decodes a payload whose CRC held: `(seq, record)`.
    pub fn decode_payload(payload: &[u8]) -> Result<(u64, Record), DecodeError> {
        let mut decoder = Decoder::new(payload);
        let seq = decoder.u64()?;
        let record = match decoder.u8()? {
            tag @ (CREATE | CREATE_SPECIAL) => decode_create(&mut decoder, tag == CREATE_SPECIAL)?,
            LINK => Record::Link {
                inode: decoder.u64()?,
                parent: decoder.u64()?,
                name: decoder.name("name", MAX_NAME_BYTES)?,
                time: decoder.time()?,
            },
            tag @ (UNLINK | RMDIR) => {
                let parent = decoder.u64()?;
                let name = decoder.name("name", MAX_NAME_BYTES)?;
                let time = decoder.time()?;
                if tag == UNLINK {
                    Record::Unlink { parent, name, time }
                } else {
                    Record::Rmdir { parent, name, time }
                }
            }
            RENAME => Record::Rename {
                parent: decoder.u64()?,
                name: decoder.name("name", MAX_NAME_BYTES)?,
                new_parent: decoder.u64()?,
                new_name: decoder.name("name", MAX_NAME_BYTES)?,
                no_replace: decoder.bool()?,
                exchange: decoder.bool()?,
                time: decoder.time()?,
            },
            SET_ATTRIBUTES => decode_set_attributes(&mut decoder)?,
            TRUNCATE => {
                Record::Truncate { inode: decoder.u64()?, size_bytes: decoder.u64()?, time: decoder.time()? }
            }
            WRITE => Record::Write {
                inode: decoder.u64()?,
                size_bytes: decoder.u64()?,
                time: decoder.time()?,
                first_page: decoder.u64()?,
                end_page: decoder.u64()?,
            },
            ALLOCATE => decode_allocate(&mut decoder)?,
            PUNCH => Record::Punch {
                inode: decoder.u64()?,
                first_page: decoder.u64()?,
                end_page: decoder.u64()?,
                time: decoder.time()?,
            },
            RELEASE => Record::Release { inode: decoder.u64()? },
            TIMES => Record::Times {
                inode: decoder.u64()?,
                atime: decoder.time()?,
                mtime: decoder.time()?,
                ctime: decoder.time()?,
            },
            tag => return Err(DecodeError::Bad(format!("record tag {tag}"))),
        };
        decoder.finish("the record")?;
        Ok((seq, record))
    }
}

/// A `Create` record's fields (`CREATE_SPECIAL`'s when `special`).
fn decode_create(decoder: &mut Decoder<'_>, special: bool) -> Result<Record, DecodeError> {
    let parent = decoder.u64()?;
    let name = decoder.name("name", MAX_NAME_BYTES)?;
    let inode = decoder.u64()?;
    let kind = decode_kind(decoder.u8()?)?;
    let mode = decoder.u16()?;
    let uid = decoder.u32()?;
    let gid = decoder.u32()?;
    let time = decoder.time()?;
    if special != kind.is_special() {
        return Err(DecodeError::Bad(format!(
            "a {kind:?} in a record of {} kind",
            if special { "special" } else { "another" }
        )));
    }
    if special {
        let rdev = decoder.u32()?;
        return Ok(Record::Create { parent, name, inode, kind, mode, uid, gid, time, target: None, rdev });
    }
    let target =
        if decoder.bool()? { Some(decoder.name("symlink target", MAX_SYMLINK_BYTES)?) } else { None };
    if target.is_some() != (kind == FileKind::Symlink) {
        return Err(DecodeError::Bad("a symlink target on a non-symlink, or none on a symlink".into()));
    }
    Ok(Record::Create { parent, name, inode, kind, mode, uid, gid, time, target, rdev: 0 })
}

/// A `SetAttributes` record's fields.
fn decode_set_attributes(decoder: &mut Decoder<'_>) -> Result<Record, DecodeError> {
    let inode = decoder.u64()?;
    let mode = decode_optional_u32(decoder)?;
    let mode = match mode {
        Some(mode) if mode > 0o7777 => return Err(DecodeError::Bad(format!("mode {mode:o}"))),
        other => other.map(|mode| mode as u16),
    };
    Ok(Record::SetAttributes {
        inode,
        mode,
        uid: decode_optional_u32(decoder)?,
        gid: decode_optional_u32(decoder)?,
        atime: decoder.optional_time()?,
        mtime: decoder.optional_time()?,
        ctime: decoder.time()?,
    })
}

/// An `Allocate` record's fields, its run count checked before any run is read.
fn decode_allocate(decoder: &mut Decoder<'_>) -> Result<Record, DecodeError> {
    let inode = decoder.u64()?;
    let size_bytes = decoder.u64()?;
    let time = decoder.optional_time()?;
    let count = decoder.count("runs", 24)?;
    if count > MAX_RUNS_PER_RECORD as u64 {
        return Err(DecodeError::TooLong { what: "runs", len: count, max: MAX_RUNS_PER_RECORD as u64 });
    }
    let mut runs = Vec::new();
    for _ in 0..count {
        runs.push(Run { file_page: decoder.u64()?, remote: decoder.u64()?, len: decoder.u64()? });
    }
    Ok(Record::Allocate { inode, runs, size_bytes, time })
}

/// The bad bytes at the end of a journal left by a crash mid-append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Where the bad frame starts: the journal is valid up to here.
    pub offset: u64,
    /// Bytes from there to the end.
    pub bytes: u64,
    pub reason: String,
}

/// A journal that cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("corrupt record at byte {offset} of the journal ({reason}), and whole records follow it: not a torn tail")]
    CorruptMiddle { offset: u64, reason: String },
    #[error("record at byte {offset} of the journal has a valid checksum but does not decode: {error}")]
    Undecodable { offset: u64, error: DecodeError },
    #[error("the journal is {bytes} bytes, more than the {max} a journal may hold")]
    TooLarge { bytes: u64, max: u64 },
}

/// What a journal holds: its records in order `(offset, seq, record)`, and a torn tail if any.
#[derive(Debug, Default)]
pub struct JournalScan {
    pub records: Vec<(u64, u64, Record)>,
    /// Bytes of whole records (where the next append goes).
    pub valid_bytes: u64,
    pub torn_tail: Option<TornTail>,
}

/// The payload of a whole frame at `offset`, or why there is none.
fn frame_at(bytes: &[u8], offset: usize) -> Result<&[u8], String> {
    let left = bytes.len() - offset;
    if left < FRAME_HEADER_BYTES {
        return Err(format!("{left} bytes, shorter than a record header"));
    }
    let header = &bytes[offset..offset + FRAME_HEADER_BYTES];
    let len_bytes: [u8; 4] = header[..4].try_into().expect("4 bytes");
    let len = u32::from_le_bytes(len_bytes) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    if len == 0 || len > MAX_RECORD_BYTES {
        return Err(format!("length {len} outside 1..={MAX_RECORD_BYTES}"));
    }
    if len > left - FRAME_HEADER_BYTES {
        return Err(format!("length {len} runs past the end ({} bytes left)", left - FRAME_HEADER_BYTES));
    }
    let payload = &bytes[offset + FRAME_HEADER_BYTES..offset + FRAME_HEADER_BYTES + len];
    if crc32c::crc32c_append(crc32c::crc32c(&len_bytes), payload) != crc {
        return Err("checksum mismatch".to_owned());
    }
    Ok(payload)
}

/// Reads every record of a journal (see the module docs for what counts as a torn tail).
pub fn decode_journal(bytes: &[u8]) -> Result<JournalScan, JournalError> {
    if bytes.len() as u64 > MAX_JOURNAL_BYTES {
        return Err(JournalError::TooLarge { bytes: bytes.len() as u64, max: MAX_JOURNAL_BYTES });
    }
    let mut scan = JournalScan::default();
    let mut offset = 0usize;
    while offset < bytes.len() {
        match frame_at(bytes, offset) {
            Ok(payload) => {
                let (seq, record) = Record::decode_payload(payload)
                    .map_err(|error| JournalError::Undecodable { offset: offset as u64, error })?;
                scan.records.push((offset as u64, seq, record));
                offset += FRAME_HEADER_BYTES + payload.len();
            }
            Err(reason) => {
                let left = bytes.len() - offset;
                // Short-circuit: the scan for a whole frame runs over at most one frame of bytes.
                if left > FRAME_HEADER_BYTES + MAX_RECORD_BYTES
                    || (offset + 1..bytes.len()).any(|candidate| frame_at(bytes, candidate).is_ok())
                {
                    return Err(JournalError::CorruptMiddle { offset: offset as u64, reason });
                }
                scan.torn_tail = Some(TornTail { offset: offset as u64, bytes: left as u64, reason });
                break;
            }
        }
    }
    scan.valid_bytes = offset as u64;
    Ok(scan)
}
