//! Minimal clients of memcached's text protocol and redis's RESP, enough to load a data set,
//! drive gets and sets, and verify every value afterwards: a batch is pipelined (all requests
//! written, then all replies read). Replies are untrusted input: lengths are bounded and any
//! unexpected reply is an error naming it.

use std::io::{BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context, Result};

use super::workload::{check_value, connect_again, fill_value, read_data_block, read_reply_line, ValueSizes};

/// Keys per pipelined batch.
const BATCH: usize = 32;

pub trait KvConnection: Sized + Send {
    fn open(port: u16) -> Result<Self>;
    /// Stores every `(id, value)`; errors unless each was stored.
    fn set_many(&mut self, items: &[(u64, &[u8])]) -> Result<()>;
    /// Each id's value, `None` when the server has no such key.
    fn get_many(&mut self, ids: &[u64], values: &mut Vec<Option<Vec<u8>>>) -> Result<()>;
}

pub struct Memcache {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    line: Vec<u8>,
}

fn memcache_key(id: u64) -> String {
    format!("k{id:012}")
}

impl KvConnection for Memcache {
    fn open(port: u16) -> Result<Memcache> {
        let stream = connect_again(port)?;
        Ok(Memcache {
            reader: BufReader::new(stream.try_clone()?),
            writer: BufWriter::new(stream),
            line: Vec::new(),
        })
    }

    fn set_many(&mut self, items: &[(u64, &[u8])]) -> Result<()> {
        for (id, value) in items {
            write!(self.writer, "set {} 0 0 {}\r\n", memcache_key(*id), value.len())?;
            self.writer.write_all(value)?;
            self.writer.write_all(b"\r\n")?;
        }
        self.writer.flush().context("sending sets")?;
        for (id, _) in items {
            read_reply_line(&mut self.reader, &mut self.line)?;
            if self.line != b"STORED" {
                bail!("set of key {id}: {:?}", String::from_utf8_lossy(&self.line));
            }
        }
        Ok(())
    }

    fn get_many(&mut self, ids: &[u64], values: &mut Vec<Option<Vec<u8>>>) -> Result<()> {
        self.writer.write_all(b"get")?;
        for id in ids {
            write!(self.writer, " {}", memcache_key(*id))?;
        }
        self.writer.write_all(b"\r\n")?;
        self.writer.flush().context("sending gets")?;
        values.clear();
        values.resize(ids.len(), None);
        // Hits come back in request order; misses are left out.
        let mut next = 0;
        loop {
            read_reply_line(&mut self.reader, &mut self.line)?;
            if self.line == b"END" {
                return Ok(());
            }
            let text = String::from_utf8_lossy(&self.line).into_owned();
            let fields: Vec<&str> = text.split(' ').collect();
            let [_, key, _, length] = fields.as_slice() else {
                bail!("unexpected get reply {text:?}");
            };
            let Some(position) = ids[next..].iter().position(|&id| memcache_key(id) == *key) else {
                bail!("get reply for key {key:?}, not asked or out of order");
            };
            let length: usize = length.parse().with_context(|| format!("get reply {text:?}"))?;
            let mut value = Vec::new();
            read_data_block(&mut self.reader, length, &mut value)?;
            values[next + position] = Some(value);
            next += position + 1;
        }
    }
}

pub struct Redis {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    line: Vec<u8>,
}

/// The key redis-benchmark's `-r` makes of `__rand_int__` (`key:` and 12 digits), so its GETs
/// read the loaded data set.
pub fn redis_key(id: u64) -> String {
    format!("key:{id:012}")
}

impl KvConnection for Redis {
    fn open(port: u16) -> Result<Redis> {
        let stream = connect_again(port)?;
        Ok(Redis {
            reader: BufReader::new(stream.try_clone()?),
            writer: BufWriter::new(stream),
            line: Vec::new(),
        })
    }

    fn set_many(&mut self, items: &[(u64, &[u8])]) -> Result<()> {
        for (id, value) in items {
            let key = redis_key(*id);
            write!(self.writer, "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n", key.len(), value.len())?;
            self.writer.write_all(value)?;
            self.writer.write_all(b"\r\n")?;
        }
        self.writer.flush().context("sending sets")?;
        for (id, _) in items {
            read_reply_line(&mut self.reader, &mut self.line)?;
            if self.line != b"+OK" {
                bail!("SET of key {id}: {:?}", String::from_utf8_lossy(&self.line));
            }
        }
        Ok(())
    }

    fn get_many(&mut self, ids: &[u64], values: &mut Vec<Option<Vec<u8>>>) -> Result<()> {
        for id in ids {
            let key = redis_key(*id);
            write!(self.writer, "*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len())?;
        }
        self.writer.flush().context("sending gets")?;
        values.clear();
        for id in ids {
            read_reply_line(&mut self.reader, &mut self.line)?;
            let text = String::from_utf8_lossy(&self.line).into_owned();
            if text == "$-1" {
                values.push(None);
                continue;
            }
            let Some(length) = text.strip_prefix('$').and_then(|length| length.parse::<usize>().ok()) else {
                bail!("GET of key {id}: unexpected reply {text:?}");
            };
            let mut value = Vec::new();
            read_data_block(&mut self.reader, length, &mut value)?;
            values.push(Some(value));
        }
        Ok(())
    }
}

/// Stores version 0 of keys `0..keys`, `clients` connections in parallel (client c loads the
/// ids congruent to c).
pub fn load<C: KvConnection>(port: u16, keys: u64, sizes: ValueSizes, clients: usize) -> Result<()> {
    each_client(clients, |client| {
        let mut connection = C::open(port)?;
        let ids: Vec<u64> = (client as u64..keys).step_by(clients).collect();
        for chunk in ids.chunks(BATCH) {
            let values: Vec<Vec<u8>> = chunk
                .iter()
                .map(|&id| {
                    let mut value = Vec::new();
                    fill_value(sizes, id, 0, &mut value);
                    value
                })
                .collect();
            let items: Vec<(u64, &[u8])> =
                chunk.iter().copied().zip(values.iter().map(Vec::as_slice)).collect();
            connection.set_many(&items)?;
        }
        Ok(())
    })
}

/// Reads every key back and checks it is exactly the version `versions` holds (0 for all when
/// `versions` is empty). Errors at the first missing or wrong value.
pub fn verify<C: KvConnection>(
    port: u16,
    keys: u64,
    sizes: ValueSizes,
    versions: &[AtomicU32],
    clients: usize,
) -> Result<()> {
    each_client(clients, |client| {
        let mut connection = C::open(port)?;
        let ids: Vec<u64> = (client as u64..keys).step_by(clients).collect();
        let mut values = Vec::new();
        let mut scratch = Vec::new();
        for chunk in ids.chunks(BATCH) {
            connection.get_many(chunk, &mut values)?;
            for (&id, value) in chunk.iter().zip(&values) {
                let Some(value) = value else { bail!("key {id} is missing after the run") };
                let expected = versions.get(id as usize).map_or(0, |version| version.load(Ordering::Relaxed));
                check_value(sizes, id, Some(expected), value, &mut scratch)?;
            }
        }
        Ok(())
    })
}

/// Runs `work(client)` on `clients` threads; the first error wins.
pub fn each_client(clients: usize, work: impl Fn(usize) -> Result<()> + Sync) -> Result<()> {
    std::thread::scope(|scope| {
        let work = &work;
        let threads: Vec<_> = (0..clients).map(|client| scope.spawn(move || work(client))).collect();
        let mut outcome = Ok(());
        for thread in threads {
            let result = thread.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked")));
            if outcome.is_ok() {
                outcome = result;
            }
        }
        outcome
    })
}
