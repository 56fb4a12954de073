//! The memcached text-protocol client ([`TextClient`]) of the bench and of the tests of
//! `remem kv`, with its answers ([`StoreOutcome`], [`Item`], [`Transition`]) and errors
//! ([`ClientError`]).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::Serialize;

/// Largest value a reply may announce; anything larger is a protocol error, not an allocation.
pub const MAX_VALUE_BYTES: usize = 64 << 20;
/// Longest reply line accepted (`VALUE`, `STAT`, status lines).
const MAX_LINE_BYTES: u64 = 64 << 10;

/// Why a request did not get the answer it asked for.
#[derive(Debug)]
pub enum ClientError {
    /// The socket failed, closed or timed out.
    Io(std::io::Error),
    /// The server answered `ERROR`, `CLIENT_ERROR ...` or `SERVER_ERROR ...` (the line).
    Server(String),
    /// The reply is not the protocol's answer to the request.
    Protocol(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Io(error) => write!(formatter, "i/o: {error}"),
            ClientError::Server(line) => write!(formatter, "server answered {line:?}"),
            ClientError::Protocol(what) => write!(formatter, "protocol: {what}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<std::io::Error> for ClientError {
    fn from(error: std::io::Error) -> ClientError {
        match error.kind() {
            // A socket timeout reads as EAGAIN; say what it means.
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => ClientError::Io(
                std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within the client's timeout"),
            ),
            _ => ClientError::Io(error),
        }
    }
}

/// The answer to a storage command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOutcome {
    Stored,
    NotStored,
    Exists,
    NotFound,
}

/// One `VALUE` of a retrieval reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub key: String,
    pub flags: u32,
    pub value: Vec<u8>,
    pub cas: Option<u64>,
}

/// A `TRANSITIONED <bytes_read> <bytes_written> <microseconds>` answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Transition {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub microseconds: u64,
}

/// A blocking client of the memcached text protocol on one TCP connection: each request is
/// written with one `write` and its reply read whole before the call returns (the `send_*` and
/// `read_*` halves allow pipelining). Every reply is checked against the protocol.
pub struct TextClient {
    reader: BufReader<TcpStream>,
    request: Vec<u8>,
}

fn is_error_line(line: &str) -> bool {
    line == "ERROR"
        || line.starts_with("ERROR ")
        || line.starts_with("CLIENT_ERROR")
        || line.starts_with("SERVER_ERROR")
}

impl TextClient {
    /// Connects with `timeout` for the connection and for every later read and write.
    pub fn connect(address: SocketAddr, timeout: Duration) -> std::io::Result<TextClient> {
        let stream = TcpStream::connect_timeout(&address, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(TextClient { reader: BufReader::with_capacity(256 << 10, stream), request: Vec::new() })
    }

    pub fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }

    /// Writes raw bytes (hostile tests, pipelining).
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.reader.get_mut().write_all(bytes)
    }

    /// Sends `<verb> <key> <flags> 0 <bytes>\r\n<value>\r\n` (`set`, `add`, `replace`, `append`,
    /// `prepend`) without waiting for the answer.
    pub fn send_store(&mut self, verb: &str, key: &str, flags: u32, value: &[u8]) -> std::io::Result<()> {
        assert!(!key.is_empty() && !key.contains([' ', '\r', '\n']), "bad key {key:?}");
        self.request.clear();
        write!(self.request, "{verb} {key} {flags} 0 {}\r\n", value.len())?;
        self.request.extend_from_slice(value);
        self.request.extend_from_slice(b"\r\n");
        self.reader.get_mut().write_all(&self.request)
    }

    /// Reads the one-line answer of a storage command.
    pub fn read_store_reply(&mut self) -> Result<StoreOutcome, ClientError> {
        let line = self.read_line()?;
        match line.as_str() {
            "STORED" => Ok(StoreOutcome::Stored),
            "NOT_STORED" => Ok(StoreOutcome::NotStored),
            "EXISTS" => Ok(StoreOutcome::Exists),
            "NOT_FOUND" => Ok(StoreOutcome::NotFound),
            _ if is_error_line(&line) => Err(ClientError::Server(line)),
            _ => Err(ClientError::Protocol(format!("storage command answered {line:?}"))),
        }
    }

    pub fn store(
        &mut self,
        verb: &str,
        key: &str,
        flags: u32,
        value: &[u8],
    ) -> Result<StoreOutcome, ClientError> {
        self.send_store(verb, key, flags, value)?;
        self.read_store_reply()
    }

    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<StoreOutcome, ClientError> {
        self.store("set", key, 0, value)
    }

    /// `cas <key> <flags> 0 <bytes> <unique>`.
    pub fn cas(
        &mut self,
        key: &str,
        flags: u32,
        value: &[u8],
        unique: u64,
    ) -> Result<StoreOutcome, ClientError> {
        self.request.clear();
        write!(self.request, "cas {key} {flags} 0 {} {unique}\r\n", value.len())?;
        self.request.extend_from_slice(value);
        self.request.extend_from_slice(b"\r\n");
        self.reader.get_mut().write_all(&self.request)?;
        self.read_store_reply()
    }

    pub fn send_get(&mut self, key: &str) -> std::io::Result<()> {
        self.request.clear();
        write!(self.request, "get {key}\r\n")?;
        self.reader.get_mut().write_all(&self.request)
    }

    /// Reads the reply of a one-key `get` into `value`; false on a miss.
    pub fn read_get_reply_into(&mut self, key: &str, value: &mut Vec<u8>) -> Result<bool, ClientError> {
        let line = self.read_line()?;
        if line == "END" {
            return Ok(false);
        }
        let (found_key, _flags, length, _cas) = parse_value_line(&line)?;
        if found_key != key {
            return Err(ClientError::Protocol(format!("asked for {key:?}, got a value of {found_key:?}")));
        }
        self.read_data(length, value)?;
        let end = self.read_line()?;
        if end != "END" {
            return Err(ClientError::Protocol(format!("one-key get: {end:?} after the value, not END")));
        }
        Ok(true)
    }

    /// `get <key>` into `value`, reusing its allocation; false on a miss.
    pub fn get_into(&mut self, key: &str, value: &mut Vec<u8>) -> Result<bool, ClientError> {
        self.send_get(key)?;
        self.read_get_reply_into(key, value)
    }

    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, ClientError> {
        let mut value = Vec::new();
        Ok(self.get_into(key, &mut value)?.then_some(value))
    }

    /// `get` or `gets` of several keys; the items in the server's order.
    pub fn retrieve(&mut self, verb: &str, keys: &[&str]) -> Result<Vec<Item>, ClientError> {
        self.request.clear();
        self.request.extend_from_slice(verb.as_bytes());
        for key in keys {
            self.request.push(b' ');
            self.request.extend_from_slice(key.as_bytes());
        }
        self.request.extend_from_slice(b"\r\n");
        self.reader.get_mut().write_all(&self.request)?;
        let mut items = Vec::new();
        loop {
            let line = self.read_line()?;
            if line == "END" {
                return Ok(items);
            }
            let (key, flags, length, cas) = parse_value_line(&line)?;
            if !keys.contains(&key.as_str()) {
                return Err(ClientError::Protocol(format!("a value of {key:?}, which was not asked for")));
            }
            let mut value = Vec::new();
            self.read_data(length, &mut value)?;
            items.push(Item { key, flags, value, cas });
        }
    }

    /// `delete <key>`: true if it existed.
    pub fn delete(&mut self, key: &str) -> Result<bool, ClientError> {
        match self.request_line(&format!("delete {key}"))?.as_str() {
            "DELETED" => Ok(true),
            "NOT_FOUND" => Ok(false),
            other => Err(ClientError::Protocol(format!("delete answered {other:?}"))),
        }
    }

    /// Sends one command line (without `\r\n`) and returns its one-line answer; an error line is
    /// `ClientError::Server`.
    pub fn request_line(&mut self, line: &str) -> Result<String, ClientError> {
        self.request.clear();
        self.request.extend_from_slice(line.as_bytes());
        self.request.extend_from_slice(b"\r\n");
        self.reader.get_mut().write_all(&self.request)?;
        let answer = self.read_line()?;
        if is_error_line(&answer) {
            return Err(ClientError::Server(answer));
        }
        Ok(answer)
    }

    /// `stats`: name -> value.
    pub fn stats(&mut self) -> Result<BTreeMap<String, String>, ClientError> {
        self.reader.get_mut().write_all(b"stats\r\n")?;
        let mut stats = BTreeMap::new();
        loop {
            let line = self.read_line()?;
            if line == "END" {
                return Ok(stats);
            }
            if is_error_line(&line) {
                return Err(ClientError::Server(line));
            }
            let mut words = line.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("STAT"), Some(name), value) => {
                    stats.insert(name.to_owned(), value.unwrap_or("").to_owned());
                }
                _ => return Err(ClientError::Protocol(format!("stats line {line:?}"))),
            }
        }
    }

    /// Meta set `ms <key> <bytes> <flags>` (e.g. flags `Prep2`); returns the status line (`HD`).
    pub fn meta_set(&mut self, key: &str, value: &[u8], flags: &str) -> Result<String, ClientError> {
        self.request.clear();
        write!(self.request, "ms {key} {}", value.len())?;
        if !flags.is_empty() {
            write!(self.request, " {flags}")?;
        }
        self.request.extend_from_slice(b"\r\n");
        self.request.extend_from_slice(value);
        self.request.extend_from_slice(b"\r\n");
        self.reader.get_mut().write_all(&self.request)?;
        let line = self.read_line()?;
        if is_error_line(&line) {
            return Err(ClientError::Server(line));
        }
        Ok(line)
    }

    /// remem kv's `transition <key> <scheme> [naive]`; `None` for `NOT_FOUND`.
    pub fn transition(
        &mut self,
        key: &str,
        scheme: &str,
        naive: bool,
    ) -> Result<Option<Transition>, ClientError> {
        let line = format!("transition {key} {scheme}{}", if naive { " naive" } else { "" });
        let answer = self.request_line(&line)?;
        if answer == "NOT_FOUND" {
            return Ok(None);
        }
        let numbers: Vec<u64> = match answer.strip_prefix("TRANSITIONED ") {
            Some(rest) => {
                rest.split(' ').map(|word| word.parse()).collect::<Result<_, _>>().unwrap_or_default()
            }
            None => Vec::new(),
        };
        match numbers[..] {
            [bytes_read, bytes_written, microseconds] => {
                Ok(Some(Transition { bytes_read, bytes_written, microseconds }))
            }
            _ => Err(ClientError::Protocol(format!("transition answered {answer:?}"))),
        }
    }

    /// Reads one `\r\n`-terminated line (without the terminator).
    pub fn read_line(&mut self) -> Result<String, ClientError> {
        let mut line = Vec::new();
        let read = (&mut self.reader).take(MAX_LINE_BYTES).read_until(b'\n', &mut line)?;
        if read == 0 {
            return Err(ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )));
        }
        if !line.ends_with(b"\r\n") {
            return Err(ClientError::Protocol(format!(
                "a line not ended by \\r\\n: {:?}",
                String::from_utf8_lossy(&line[..line.len().min(200)])
            )));
        }
        line.truncate(line.len() - 2);
        String::from_utf8(line)
            .map_err(|error| ClientError::Protocol(format!("a line not in UTF-8: {error}")))
    }

    fn read_data(&mut self, length: usize, value: &mut Vec<u8>) -> Result<(), ClientError> {
        value.clear();
        value.reserve(length + 2);
        // read_to_end on a bounded reader copies without zero-filling the buffer first.
        let read = (&mut self.reader).take(length as u64 + 2).read_to_end(value)?;
        if read != length + 2 {
            return Err(ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the server closed the connection {read} bytes into a {length}-byte value"),
            )));
        }
        if !value.ends_with(b"\r\n") {
            return Err(ClientError::Protocol(format!("a {length}-byte value not followed by \\r\\n")));
        }
        value.truncate(length);
        Ok(())
    }
}

/// `VALUE <key> <flags> <bytes> [<cas>]` -> its fields.
fn parse_value_line(line: &str) -> Result<(String, u32, usize, Option<u64>), ClientError> {
    let bad =
        || ClientError::Protocol(format!("expected VALUE or END, got {:?}", &line[..line.len().min(200)]));
    if is_error_line(line) {
        return Err(ClientError::Server(line.to_owned()));
    }
    let words: Vec<&str> = line.split(' ').collect();
    let (key, flags, length, cas) = match words[..] {
        ["VALUE", key, flags, length] => (key, flags, length, None),
        ["VALUE", key, flags, length, cas] => (key, flags, length, Some(cas)),
        _ => return Err(bad()),
    };
    let flags: u32 = flags.parse().map_err(|_| bad())?;
    let length: usize = length.parse().map_err(|_| bad())?;
    let cas = cas.map(|cas| cas.parse::<u64>()).transpose().map_err(|_| bad())?;
    if length > MAX_VALUE_BYTES {
        return Err(ClientError::Protocol(format!("a value of {length} bytes announced")));
    }
    Ok((key.to_owned(), flags, length, cas))
}
