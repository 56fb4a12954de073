//! Replies out: into each connection's order, then to its socket, from the loop's thread or
//! through a reply writer (`crate::writers`), and connections closed once their replies are out.

use std::io::{self, IoSlice, Write};

use mio::{Interest, Token};

use super::{Connection, Server, FIRST_CONNECTION};
use crate::writers::{output_slices, WRITE_SLICES};

impl Server {
    /// Puts finished replies in their connections' order and writes what is due.
    pub(super) fn dispatch(&mut self) {
        // Values that finished during the last engine call without a settle after it (a key
        // of a resumed multi-get served from the chunk cache) are answered now.
        crate::dispatch::settle(&mut self.cache, &mut self.outbox);
        if self.outbox.is_empty() {
            return;
        }
        // No reply leaves before the standby's copy (or, with --etcd, the state region in
        // remote memory) holds the records it acknowledges. If that copy cannot be made, no
        // reply leaves at all and the server stops.
        if let Err(error) = self.cache.durability_barrier() {
            tracing::error!(%error, "the state could not be made durable: stopping");
            self.failed = Some(error);
            return;
        }
        let outs = self.outbox.take();
        let mut touched = Vec::new();
        for out in outs {
            // The reply replaces what was reserved for it (a closed connection's is dropped).
            self.cache.budget_mut().release(out.conn, out.reserved);
            let Some(connection) = self.connections.get_mut(out.conn.index).and_then(Option::as_mut) else {
                continue;
            };
            if connection.generation != out.conn.generation {
                continue;
            }
            // Pending requests are few (replies go out in order); the one this reply starts is
            // usually at the front.
            if let Some(position) = connection.started.iter().position(|&(seq, _, _)| seq == out.seq) {
                let (_, kind, started) = connection.started.remove(position).expect("found above");
                self.cache.stats_mut().latency.record(kind, started.elapsed());
            }
            // A place an earlier reply ended its command through sends nothing.
            if out.seq >= connection.next_to_send {
                self.cache.budget_mut().hold(out.conn, out.bytes.len());
                let previous = connection.replies.insert(out.seq, (out.bytes, out.ends_through));
                assert!(previous.is_none(), "two replies for place {}", out.seq);
            }
            if !touched.contains(&out.conn.index) {
                touched.push(out.conn.index);
            }
        }
        for index in touched {
            let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { continue };
            while let Some((bytes, ends_through)) = connection.replies.remove(&connection.next_to_send) {
                connection.push_output(bytes);
                connection.next_to_send += 1;
                if let Some(through) = ends_through {
                    // The rest of the command (some of it may be done already) sends nothing.
                    let rest = connection.replies.split_off(&(through + 1));
                    let dropped = std::mem::replace(&mut connection.replies, rest);
                    let dropped_bytes = dropped.values().map(|(bytes, _)| bytes.len()).sum();
                    self.cache.budget_mut().release(connection.conn(index), dropped_bytes);
                    connection.next_to_send = connection.next_to_send.max(through + 1);
                }
            }
            self.write_connection(index);
        }
    }

    pub(super) fn write_connection(&mut self, index: usize) {
        let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { return };
        let conn = connection.conn(index);
        let writers = self.writers.as_ref().filter(|_| !connection.stream.is_tls());
        if let Some(writers) = writers {
            let direct = connection.in_writer == 0 && self.turn_events <= 1 && writers.sleeping(index);
            if !direct {
                hand_to_writer(writers, index, connection);
                self.after_write(index);
                return;
            }
        }
        while connection.output_bytes > 0 && !connection.dead {
            let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
            let count = output_slices(&connection.output, connection.output_sent, &mut slices);
            match connection.stream.write_vectored(&slices[..count]) {
                Ok(0) => connection.dead = true,
                Ok(written) => {
                    connection.consume_output(written);
                    self.cache.budget_mut().release(conn, written);
                    self.cache.stats_mut().bytes_written += written as u64;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => connection.dead = true,
            }
        }
        // A TLS stream's records still waiting count as output not out.
        if connection.stream.wants_write() && !connection.dead {
            match connection.stream.send_pending() {
                Err(error) if error.kind() != io::ErrorKind::WouldBlock => connection.dead = true,
                _ => {}
            }
        }
        let blocked = (connection.output_bytes > 0 || connection.stream.wants_write()) && !connection.dead;
        if let (Some(writers), true) = (writers, blocked) {
            // The socket is full: the writer waits for it, not the loop.
            hand_to_writer(writers, index, connection);
        } else if blocked != connection.wants_writable {
            let interest = if blocked { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
            let token = Token(FIRST_CONNECTION + index);
            match self.poll.registry().reregister(connection.stream.source(), token, interest) {
                Ok(()) => connection.wants_writable = blocked,
                Err(_) => connection.dead = true,
            }
        }
        self.after_write(index);
    }

    /// A write made room: a paused connection may take requests again, a closing one close.
    pub(super) fn after_write(&mut self, index: usize) {
        let Some(connection) = self.connections[index].as_ref() else { return };
        if connection.paused && self.may_resume(index, connection) {
            if let Some(connection) = self.connections[index].as_mut() {
                connection.paused = false;
            }
            self.process(index);
            self.read_connection(index);
            return;
        }
        self.close_if_done(index);
    }

    /// Applies the writers' reports: written bytes leave their connection's output and budget.
    pub(super) fn take_reports(&mut self) {
        let Some(writers) = &self.writers else { return };
        let mut touched = Vec::new();
        while let Some(report) = writers.report() {
            let Some(connection) = self.connections.get_mut(report.index).and_then(Option::as_mut) else {
                continue;
            };
            if connection.generation != report.generation {
                continue;
            }
            assert!(report.bytes <= connection.in_writer, "a writer reports only bytes it was handed");
            connection.in_writer -= report.bytes;
            connection.output_bytes -= report.bytes;
            if report.failed {
                connection.dead = true;
            }
            let conn = connection.conn(report.index);
            self.cache.budget_mut().release(conn, report.bytes);
            self.cache.stats_mut().bytes_written += report.bytes as u64;
            self.cache.stats_mut().writer_bytes_written += report.bytes as u64;
            if !touched.contains(&report.index) {
                touched.push(report.index);
            }
        }
        for index in touched {
            self.after_write(index);
        }
    }

    /// Before the loop blocks: writers must wake it when a connection waits on their reports
    /// (paused, or closing with bytes in a writer). True when reports came meanwhile.
    pub(super) fn ask_for_reports(&mut self) -> bool {
        let want = self.connections.iter().flatten().any(|connection| {
            connection.paused || ((connection.closing || connection.dead) && connection.in_writer > 0)
        });
        let Some(writers) = &self.writers else { return false };
        if !want {
            return false;
        }
        writers.want_reports(true);
        let before: usize = self.connections.iter().flatten().map(|connection| connection.in_writer).sum();
        self.take_reports();
        let after: usize = self.connections.iter().flatten().map(|connection| connection.in_writer).sum();
        after != before
    }

    pub(super) fn close_if_done(&mut self, index: usize) {
        let Some(connection) = self.connections.get_mut(index).and_then(Option::as_mut) else { return };
        let replies_out = connection.next_to_send == connection.next_seq
            && connection.output_bytes == 0
            && !connection.stream.wants_write();
        if connection.dead || (connection.closing && replies_out) {
            let mut connection = self.connections[index].take().expect("present");
            let _ = self.poll.registry().deregister(connection.stream.source());
            if let Some(writers) = &self.writers {
                let generation = connection.generation;
                writers.send(index, crate::writers::Job::Forget { index, generation });
            }
            self.cache.stats_mut().curr_connections -= 1;
            // Its buffers go now; the reservations of its fetches in flight go when they finish.
            let conn = connection.conn(index);
            let buffered = connection.buffered_bytes();
            assert!(buffered <= self.cache.budget().held_by(conn), "a connection holds what it buffers");
            self.cache.budget_mut().release(conn, buffered);
            self.cache.budget_mut().close(conn);
        }
    }
}

/// Hands a connection's output to its reply writer; the bytes stay counted until reported.
fn hand_to_writer(writers: &crate::writers::Writers, index: usize, connection: &mut Connection) {
    if connection.output.is_empty() || connection.dead {
        return;
    }
    let buffers = std::mem::take(&mut connection.output);
    let offset = std::mem::take(&mut connection.output_sent);
    let handed: usize = buffers.iter().map(Vec::len).sum::<usize>() - offset;
    connection.in_writer += handed;
    assert_eq!(connection.in_writer, connection.output_bytes, "all output is in the writer");
    let generation = connection.generation;
    writers.send(index, crate::writers::Job::Write { index, generation, buffers, offset });
}
