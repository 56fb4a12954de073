//! The messages between a primary `remem kv` and its standby, on the Unix socket
//! `kv-NAME/standby.sock` (docs/KV.md "Standby").
//!
//! A frame is `len: u32 | tag: u8 | body`, `len` counting tag and body, at most
//! [`MAX_FRAME_BYTES`]. Integers are little endian. The standby trusts nothing in a frame: a
//! length, an offset or a tag out of range is an error, never a panic.

use crate::backup::CHUNK_BYTES;

/// Version of this protocol; a standby of another version is refused at its hello. 2: the hello
/// carries the standby's settings, the welcome the attach id that names the standby's files.
pub const PROTOCOL_VERSION: u32 = 2;
/// The largest frame: a whole chunk written by the synchronous-RPC replica, plus its header.
pub const MAX_FRAME_BYTES: usize = CHUNK_BYTES + 64;
/// The longest text a frame carries (an address, a refusal, a setting's name or value).
const MAX_TEXT_BYTES: usize = 4096;
/// The most settings a hello carries.
pub const MAX_SETTINGS: usize = 64;

/// How the primary keeps the standby's backup region equal to its own (seed 004, MacR II.C).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The primary stores into the standby's region itself (a shared mapping): the standby's
    /// CPU does nothing while the primary serves.
    OneSided,
    /// Each change is sent to the standby, which writes it and acknowledges; replies wait for
    /// the acknowledgement (one round trip per event-loop pass: group commit).
    Rpc,
    /// Each change is appended to a ring in the standby's memory, which the standby drains by
    /// polling; replies do not wait for the standby.
    Log,
}

impl Mode {
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "one-sided" => Some(Mode::OneSided),
            "rpc" => Some(Mode::Rpc),
            "log" => Some(Mode::Log),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::OneSided => "one-sided",
            Mode::Rpc => "rpc",
            Mode::Log => "log",
        }
    }

    fn code(self) -> u8 {
        match self {
            Mode::OneSided => 1,
            Mode::Rpc => 2,
            Mode::Log => 3,
        }
    }

    fn from_code(code: u8) -> Option<Mode> {
        match code {
            1 => Some(Mode::OneSided),
            2 => Some(Mode::Rpc),
            3 => Some(Mode::Log),
            _ => None,
        }
    }
}

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const READY: u8 = 3;
const REFUSED: u8 = 4;
const PROGRESS: u8 = 5;
const SYNCED: u8 = 6;
const HEARTBEAT: u8 = 7;
const WRITE: u8 = 8;
const STATE: u8 = 9;
const BARRIER: u8 = 10;
const ACK: u8 = 11;

#[derive(Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// Standby to primary: the first frame, with the settings a takeover needs to be the
    /// primary's (`(flag, value)`, as `crate::standby::Settings`). A version 1 hello has none.
    Hello {
        version: u32,
        settings: Vec<(&'a str, &'a str)>,
    },
    /// Primary to standby: how it replicates, the size of its region, where it serves, and the
    /// attach id that names the standby's files in the state directory.
    Welcome {
        version: u32,
        mode: Mode,
        chunk_count: u32,
        attach_id: u64,
        listen: &'a str,
        unix: &'a str,
    },
    /// Standby to primary: its region (and ring) are created at their paths in the state
    /// directory.
    Ready,
    /// Primary to standby: not taken (another standby is attached, another version).
    Refused {
        reason: &'a str,
    },
    /// Primary to standby: the sync's progress, in chunks.
    Progress {
        done: u32,
        total: u32,
    },
    /// Primary to standby: the region is a copy of the primary's; from now on the standby may
    /// take over.
    Synced {
        records: u64,
        micros: u64,
    },
    Heartbeat,
    /// Primary to standby (RPC mode): bytes to store at `offset` of the region.
    Write {
        offset: u64,
        bytes: &'a [u8],
    },
    /// Primary to standby (RPC mode): a slot's state word.
    State {
        offset: u64,
        state: u32,
    },
    /// Primary to standby (RPC mode): acknowledge everything before this.
    Barrier {
        seq: u64,
    },
    /// Standby to primary (RPC mode).
    Ack {
        seq: u64,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("frame of {0} bytes (at most {MAX_FRAME_BYTES})")]
    FrameLength(usize),
    #[error("unknown message tag {0}")]
    Tag(u8),
    #[error("message {tag} of {len} bytes is malformed")]
    Malformed { tag: u8, len: usize },
    #[error("unknown replication mode {0}")]
    Mode(u8),
}

/// `text` cut to at most [`MAX_TEXT_BYTES`], on a character boundary (the decoder refuses
/// text that is not UTF-8).
fn cut(text: &str) -> &str {
    let mut end = text.len().min(MAX_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A text as `len: u32 | bytes`, cut to [`MAX_TEXT_BYTES`].
fn put_text(text: &str, out: &mut Vec<u8>) {
    let text = cut(text);
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// Appends `message` as one frame to `out`.
pub fn encode(message: &Message, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    match *message {
        Message::Hello { version, ref settings } => {
            assert!(settings.len() <= MAX_SETTINGS, "{} settings", settings.len());
            out.push(HELLO);
            out.extend_from_slice(&version.to_le_bytes());
            out.extend_from_slice(&(settings.len() as u32).to_le_bytes());
            for &(name, value) in settings {
                put_text(name, out);
                put_text(value, out);
            }
        }
        Message::Welcome { version, mode, chunk_count, attach_id, listen, unix } => {
            out.push(WELCOME);
            out.extend_from_slice(&version.to_le_bytes());
            out.push(mode.code());
            out.extend_from_slice(&chunk_count.to_le_bytes());
            out.extend_from_slice(&attach_id.to_le_bytes());
            for text in [listen, unix] {
                put_text(text, out);
            }
        }
        Message::Ready => out.push(READY),
        Message::Refused { reason } => {
            out.push(REFUSED);
            out.extend_from_slice(cut(reason).as_bytes());
        }
        Message::Progress { done, total } => {
            out.push(PROGRESS);
            out.extend_from_slice(&done.to_le_bytes());
            out.extend_from_slice(&total.to_le_bytes());
        }
        Message::Synced { records, micros } => {
            out.push(SYNCED);
            out.extend_from_slice(&records.to_le_bytes());
            out.extend_from_slice(&micros.to_le_bytes());
        }
        Message::Heartbeat => out.push(HEARTBEAT),
        Message::Write { offset, bytes } => {
            out.push(WRITE);
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(bytes);
        }
        Message::State { offset, state } => {
            out.push(STATE);
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&state.to_le_bytes());
        }
        Message::Barrier { seq } => {
            out.push(BARRIER);
            out.extend_from_slice(&seq.to_le_bytes());
        }
        Message::Ack { seq } => {
            out.push(ACK);
            out.extend_from_slice(&seq.to_le_bytes());
        }
    }
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// The length of the frame that starts `buffer` (header included), once its header is there.
pub fn frame_len(buffer: &[u8]) -> Result<Option<usize>, WireError> {
    let Some(header) = buffer.get(..4) else { return Ok(None) };
    let len = u32::from_le_bytes(header.try_into().expect("4 bytes")) as usize;
    if len == 0 || len > MAX_FRAME_BYTES {
        return Err(WireError::FrameLength(len));
    }
    Ok(Some(4 + len))
}

/// Decodes one frame's tag and body (the frame without its length).
pub fn decode(frame: &[u8]) -> Result<Message<'_>, WireError> {
    let (&tag, body) = frame.split_first().ok_or(WireError::FrameLength(0))?;
    let malformed = || WireError::Malformed { tag, len: body.len() };
    let u32_at = |at: usize| -> Result<u32, WireError> {
        body.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).ok_or_else(malformed)
    };
    let u64_at = |at: usize| -> Result<u64, WireError> {
        body.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).ok_or_else(malformed)
    };
    let exact = |len: usize| if body.len() == len { Ok(()) } else { Err(malformed()) };
    // A text at `*at`, moving `*at` past it.
    let text_at = |at: &mut usize| -> Result<&str, WireError> {
        let len = u32_at(*at)? as usize;
        *at += 4;
        if len > MAX_TEXT_BYTES {
            return Err(malformed());
        }
        let bytes = body.get(*at..*at + len).ok_or_else(malformed)?;
        *at += len;
        std::str::from_utf8(bytes).map_err(|_| malformed())
    };
    Ok(match tag {
        HELLO => {
            let version = u32_at(0)?;
            let mut settings = Vec::new();
            // A version 1 hello ends at its version: the primary refuses it by that version.
            if body.len() > 4 {
                let count = u32_at(4)? as usize;
                if count > MAX_SETTINGS {
                    return Err(malformed());
                }
                let mut at = 8;
                for _ in 0..count {
                    let name = text_at(&mut at)?;
                    settings.push((name, text_at(&mut at)?));
                }
                exact(at)?;
            }
            Message::Hello { version, settings }
        }
        WELCOME => {
            let version = u32_at(0)?;
            let mode_code = *body.get(4).ok_or_else(malformed)?;
            let mode = Mode::from_code(mode_code).ok_or(WireError::Mode(mode_code))?;
            let chunk_count = u32_at(5)?;
            let attach_id = u64_at(9)?;
            let mut at = 17;
            let listen = text_at(&mut at)?;
            let unix = text_at(&mut at)?;
            exact(at)?;
            Message::Welcome { version, mode, chunk_count, attach_id, listen, unix }
        }
        READY => {
            exact(0)?;
            Message::Ready
        }
        REFUSED => {
            if body.len() > MAX_TEXT_BYTES {
                return Err(malformed());
            }
            Message::Refused { reason: std::str::from_utf8(body).map_err(|_| malformed())? }
        }
        PROGRESS => {
            exact(8)?;
            Message::Progress { done: u32_at(0)?, total: u32_at(4)? }
        }
        SYNCED => {
            exact(16)?;
            Message::Synced { records: u64_at(0)?, micros: u64_at(8)? }
        }
        HEARTBEAT => {
            exact(0)?;
            Message::Heartbeat
        }
        WRITE => Message::Write { offset: u64_at(0)?, bytes: &body[8..] },
        STATE => {
            exact(12)?;
            Message::State { offset: u64_at(0)?, state: u32_at(8)? }
        }
        BARRIER => {
            exact(8)?;
            Message::Barrier { seq: u64_at(0)? }
        }
        ACK => {
            exact(8)?;
            Message::Ack { seq: u64_at(0)? }
        }
        other => return Err(WireError::Tag(other)),
    })
}

/// Frames read from a stream: bytes go in, whole frames come out, in order.
pub struct FrameReader {
    buffer: Vec<u8>,
    start: usize,
    /// What a read lands in, zeroed once (not 64 KiB zeroed per read call).
    scratch: Box<[u8]>,
}

impl Default for FrameReader {
    fn default() -> FrameReader {
        FrameReader { buffer: Vec::new(), start: 0, scratch: vec![0; 64 * 1024].into_boxed_slice() }
    }
}

impl FrameReader {
    /// Reads what `source` has (one read call).
    pub fn fill(&mut self, source: &mut impl std::io::Read) -> std::io::Result<usize> {
        // What was taken goes; a partial frame (at most one) moves to the front.
        if self.start > 0 {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        let result = source.read(&mut self.scratch);
        let read = *result.as_ref().unwrap_or(&0);
        self.buffer.extend_from_slice(&self.scratch[..read]);
        result
    }

    /// The next whole frame (without its length), if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, WireError> {
        let pending = &self.buffer[self.start..];
        let Some(len) = frame_len(pending)? else { return Ok(None) };
        if pending.len() < len {
            return Ok(None);
        }
        let frame = &self.buffer[self.start + 4..self.start + len];
        self.start += len;
        Ok(Some(frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(message: Message) {
        let mut out = Vec::new();
        encode(&message, &mut out);
        assert_eq!(frame_len(&out).unwrap(), Some(out.len()));
        assert_eq!(decode(&out[4..]).unwrap(), message);
    }

    #[test]
    fn every_message_round_trips() {
        round_trip(Message::Hello { version: 2, settings: vec![("-m", "16.00 MiB"), ("--scheme", "auto")] });
        round_trip(Message::Hello { version: 2, settings: vec![] });
        round_trip(Message::Welcome {
            version: 2,
            mode: Mode::Log,
            chunk_count: 77,
            attach_id: 0x0123_4567_89ab_cdef,
            listen: "127.0.0.1:11211",
            unix: "",
        });
        round_trip(Message::Ready);
        round_trip(Message::Refused { reason: "a standby is attached already" });
        round_trip(Message::Progress { done: 3, total: 9 });
        round_trip(Message::Synced { records: 10, micros: 99 });
        round_trip(Message::Heartbeat);
        round_trip(Message::Write { offset: 4096, bytes: b"abc" });
        round_trip(Message::State { offset: 8192, state: 7 });
        round_trip(Message::Barrier { seq: 5 });
        round_trip(Message::Ack { seq: 5 });
    }

    #[test]
    fn frames_split_anywhere_come_out_whole_and_in_order() {
        let mut stream = Vec::new();
        encode(&Message::Write { offset: 1, bytes: &[9; 300] }, &mut stream);
        encode(&Message::Barrier { seq: 2 }, &mut stream);
        for cut in 0..stream.len() {
            let mut reader = FrameReader::default();
            let mut seen = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                let mut part = part;
                reader.fill(&mut part).unwrap();
                while let Some(frame) = reader.next_frame().unwrap() {
                    seen.push(format!("{:?}", decode(frame).unwrap()));
                }
            }
            assert_eq!(seen.len(), 2, "cut at {cut}");
        }
    }

    #[test]
    fn a_version_1_hello_decodes_so_that_its_version_can_be_refused() {
        let mut frame = vec![HELLO];
        frame.extend_from_slice(&1u32.to_le_bytes());
        assert_eq!(decode(&frame), Ok(Message::Hello { version: 1, settings: vec![] }));
    }

    #[test]
    fn oversized_and_empty_frames_are_refused() {
        let mut frame = ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes().to_vec();
        frame.push(HELLO);
        assert!(matches!(frame_len(&frame), Err(WireError::FrameLength(_))));
        assert!(matches!(frame_len(&[0, 0, 0, 0]), Err(WireError::FrameLength(0))));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
            let mut reader = FrameReader::default();
            let mut input = bytes.as_slice();
            let _ = reader.fill(&mut input);
            while let Ok(Some(frame)) = reader.next_frame() {
                let _ = decode(frame);
            }
        }

        #[test]
        fn welcome_texts_of_any_length_round_trip_or_are_refused(listen in ".{0,40}", unix in ".{0,40}", attach_id: u64) {
            round_trip(Message::Welcome { version: 2, mode: Mode::OneSided, chunk_count: 1, attach_id, listen: &listen, unix: &unix });
        }

        #[test]
        fn hello_settings_of_any_text_round_trip(settings in proptest::collection::vec((".{0,20}", ".{0,40}"), 0..MAX_SETTINGS)) {
            let settings: Vec<(&str, &str)> = settings.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
            round_trip(Message::Hello { version: 2, settings });
        }
    }
}
