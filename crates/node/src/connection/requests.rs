//! The one request of a connection that the shell serves itself, because it carries a file
//! descriptor: `ExportSlab` (a slab's memfd over a Unix socket, docs/SHM.md). The core checked it
//! (`core::Session`); this sends it.

use super::{end_of_io, Connection, ConnectionEnd};
use crate::core::{Refusal, Slab, SlabError};
use remem_proto::{Control, HEADER_BYTES};

impl Connection {
    /// Sends `SlabExported` with the slab's memfd attached (SCM_RIGHTS), after every reply
    /// already pending so replies stay in request order; or `UnknownSlab` if the slab left the
    /// table meanwhile.
    pub(super) fn export_slab(
        &mut self,
        request_id: u64,
        slab_id: u32,
        slab: &Slab,
    ) -> Result<(), ConnectionEnd> {
        let Some(memfd) = slab.export() else {
            let refusal = Refusal::from(SlabError::UnknownSlab { slab_id });
            tracing::debug!(client_id = self.client_id, error = %refusal, "request refused");
            self.push_control(request_id, &refusal.reply());
            return Ok(());
        };
        let mut frame = Vec::with_capacity(HEADER_BYTES + 64);
        Control::SlabExported { slab_id, epoch: slab.epoch(), layout: slab.layout() }
            .encode(request_id, &mut frame);
        self.flush()?;
        // Only on a Unix connection, which is never encrypted.
        let sent = {
            let _guard = self.handle.lock_writes();
            self.stream.send_with_fd(&frame, memfd)
        };
        tracing::info!(client_id = self.client_id, slab_id, epoch = slab.epoch(), "slab exported");
        sent.map_err(end_of_io)
    }
}
