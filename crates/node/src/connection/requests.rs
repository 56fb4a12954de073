//! The requests of a connection that are not on the data path: fault injection (only with
//! `--fault-injection`) and `ExportSlab` (a slab's memfd over a Unix socket, docs/SHM.md).

use super::{end_of_io, Connection, ConnectionEnd};
use crate::fault::{self, DelayFault};
use crate::slab::SlabError;
use remem_proto::{Control, ErrorCode, FaultKind, HEADER_BYTES};

impl Connection {
    pub(super) fn inject_fault(
        &mut self,
        fault: FaultKind,
        slab_id: u32,
        delay: DelayFault,
        flips: u32,
    ) -> Control {
        let client_id = self.client_id;
        if !self.shared.faults.enabled {
            return Control::error(
                ErrorCode::Unsupported,
                "fault injection is off: start the node with --fault-injection",
            );
        }
        match fault {
            FaultKind::Delay => {
                tracing::warn!(
                    client_id,
                    delay_us = delay.delay_us,
                    fraction_ppm = delay.fraction_ppm,
                    seed = delay.seed,
                    "fault: reply delay set"
                );
                self.shared.faults.set_delay(delay);
                Control::Ok
            }
            FaultKind::ClearFaults => {
                tracing::warn!(client_id, "fault: faults cleared");
                self.shared.faults.set_delay(DelayFault::default());
                Control::Ok
            }
            FaultKind::Corrupt => match self.shared.table.get(client_id, slab_id) {
                Ok(slab) => {
                    let slots = fault::corrupt(&slab, flips, delay.seed);
                    tracing::warn!(
                        client_id,
                        slab_id,
                        flips,
                        seed = delay.seed,
                        ?slots,
                        "fault: bits flipped"
                    );
                    Control::Ok
                }
                Err(error) => self.refusal_reply(error),
            },
            FaultKind::Evict => {
                let evicted = self
                    .shared
                    .table
                    .get(client_id, slab_id)
                    .and_then(|_| self.shared.evict_slab(slab_id, Some(self.number)));
                match evicted {
                    Ok(_) => {
                        // This connection is the owner's too: it hears of the eviction first.
                        self.push_control(0, &Control::SlabEvicted { slab_id });
                        Control::Ok
                    }
                    Err(error) => self.refusal_reply(error),
                }
            }
        }
    }

    /// Sends `SlabExported` with the slab's memfd attached (SCM_RIGHTS), after every reply
    /// already pending so replies stay in request order. Returns the refusal to send instead, if
    /// any: `Unsupported` on a TCP connection or for a slab being rebuilt (the rebuild's
    /// conditional stores take a lock that plain stores from the client would bypass),
    /// `UnknownSlab`, `NotOwner`.
    pub(super) fn export_slab(
        &mut self,
        request_id: u64,
        slab_id: u32,
    ) -> Result<Option<Control>, ConnectionEnd> {
        if !self.stream.is_unix() {
            return Ok(Some(Control::error(
                ErrorCode::Unsupported,
                "ExportSlab needs a Unix-socket connection",
            )));
        }
        let slab = match self.shared.table.get(self.client_id, slab_id) {
            Ok(slab) => slab,
            Err(error) => return Ok(Some(self.refusal_reply(error))),
        };
        if slab.is_regenerating() {
            return Ok(Some(Control::error(ErrorCode::Unsupported, "slab is being rebuilt")));
        }
        let Some(memfd) = slab.export() else {
            return Ok(Some(self.refusal_reply(SlabError::UnknownSlab { slab_id })));
        };
        let mut frame = Vec::with_capacity(HEADER_BYTES + 64);
        Control::SlabExported { slab_id, epoch: slab.epoch(), layout: slab.layout() }
            .encode(request_id, &mut frame);
        self.flush()?;
        let sent = {
            let _guard = self.handle.lock_writes();
            self.stream.send_with_fd(&frame, memfd)
        };
        tracing::info!(client_id = self.client_id, slab_id, epoch = slab.epoch(), "slab exported");
        sent.map(|()| None).map_err(end_of_io)
    }

    pub(super) fn refusal_reply(&self, error: SlabError) -> Control {
        tracing::debug!(client_id = self.client_id, %error, "request refused");
        Control::error(error.code(), error.to_string())
    }
}
