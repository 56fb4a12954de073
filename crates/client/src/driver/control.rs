//! Blocking control calls of the blocking driver, between batches: a request to one node and
//! the loop run until its reply (mapping slabs, node info, probes for the bench, exporting slabs
//! as shared memory, releasing everything).

use std::time::{Duration, Instant};

use remem_proto::Control;

use super::Client;
use crate::engine::{NoBuffers, NodeId, OpBuffers, Probe};
use crate::error::PageError;
use crate::shm::{self, ShmSlab};

impl Client {
    /// Sends one control request to a node and runs the event loop until its reply arrives.
    pub(super) fn control(&mut self, node: NodeId, message: &Control) -> Result<Control, PageError> {
        assert_eq!(self.engine.active(), 0, "control requests run between batches");
        self.control_with(node, message, &mut NoBuffers)
    }

    /// [`Client::control`] while ops may be in flight: `buffers` are theirs (their completions
    /// wait in the engine for the caller, as after any turn of the loop).
    pub(super) fn control_with(
        &mut self,
        node: NodeId,
        message: &Control,
        buffers: &mut dyn OpBuffers,
    ) -> Result<Control, PageError> {
        let address = self.engine.node(node).address;
        let Some(id) = self.engine.queue_control(node, message) else {
            return Err(PageError::NodeDown { address });
        };
        self.transport.flush(&mut self.engine, node, buffers);
        let deadline = Instant::now() + self.config.request_timeout;
        loop {
            if let Some((_, reply)) = self.engine.take_control_reply(id) {
                return match reply {
                    Control::Error { code, message } => {
                        Err(PageError::Refused { address, code: format!("{code:?}"), message })
                    }
                    reply => Ok(reply),
                };
            }
            if !self.engine.node(node).connected {
                self.engine.forget_control(id);
                return Err(PageError::NodeDown { address });
            }
            let now = Instant::now();
            if now >= deadline {
                self.engine.forget_control(id);
                return Err(PageError::Timeout { address });
            }
            self.run_loop_once(Some((deadline - now).min(Duration::from_millis(100))), buffers);
        }
    }

    /// The remote memory this client holds: its slabs and their metadata, from what the nodes
    /// report (each node's totals split evenly over its slabs).
    pub fn memory_report(&mut self) -> super::MemoryReport {
        let infos = self.node_infos();
        let address_space_bytes = (0..self.engine.ranges().len())
            .filter(|&range| self.engine.range_mapped(range))
            .map(|range| self.engine.pages_per_range_of(range))
            .sum::<u64>()
            * self.config.page_bytes as u64;
        let mut report = super::MemoryReport { address_space_bytes, ..super::MemoryReport::default() };
        let mut mine = vec![0u64; self.engine.nodes().len()];
        for range in self.engine.ranges() {
            for slab in &range.slabs {
                mine[slab.node] += 1;
            }
        }
        for (node, (_, info)) in infos.iter().enumerate() {
            if let Ok(info) = info {
                report.slab_bytes += mine[node] * info.slab_size_bytes;
                if info.slabs_mapped > 0 {
                    report.metadata_bytes += info.metadata_bytes * mine[node] / info.slabs_mapped as u64;
                }
            }
        }
        report
    }

    /// Prepares a raw fan-out probe for the transport floor: one slab of `split_bytes` slots on
    /// each of `nodes`, read at slot 0; the probe op is done at the `need`-th reply. Returns the
    /// probe index for [`super::PageOp::Probe`].
    pub fn prepare_probe(
        &mut self,
        nodes: &[usize],
        split_bytes: usize,
        need: usize,
    ) -> Result<usize, PageError> {
        assert!(need >= 1 && need <= nodes.len() && nodes.len() <= crate::engine::MAX_SPLITS);
        let mut targets = Vec::with_capacity(nodes.len());
        for &node in nodes {
            let message = Control::MapSlab {
                split_bytes: split_bytes as u32,
                split_index: 0,
                first_page: 0,
                range_id: u64::MAX,
            };
            match self.control(node, &message)? {
                Control::SlabMapped { slab_id, .. } => targets.push((node, slab_id)),
                other => {
                    let address = self.engine.node(node).address;
                    return Err(PageError::Protocol {
                        address,
                        message: format!("{:?} reply", other.kind()),
                    });
                }
            }
        }
        Ok(self.engine.add_probe(Probe { targets, need }))
    }

    /// Unmaps every slab of this client. Also done on drop; call it to see the errors.
    pub fn release(&mut self) -> Result<(), PageError> {
        // Our mappings go first: a slab is never touched again once its unmap is on the way.
        let slabs = self.engine.take_all_slabs();
        let mut first_error = None;
        for (node, slab_id) in slabs {
            if !self.engine.node(node).connected {
                continue;
            }
            if let Err(error) = self.control(node, &Control::UnmapSlab { slab_id }) {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Tells every node that this client's connection answers its resource monitor's activity
    /// questions (`AnswerActivity`). A node that refuses is only logged.
    pub(super) fn volunteer_for_activity(&mut self) {
        for node in 0..self.engine.nodes().len() {
            if !self.engine.node(node).connected {
                continue;
            }
            if let Err(error) = self.control(node, &Control::AnswerActivity) {
                let address = self.engine.node(node).address;
                tracing::warn!(node = %address, %error, "node will not ask us about activity");
            }
        }
    }

    /// Asks every Unix-socket node to export this client's slabs on it and maps them. A slab
    /// that cannot be exported stays on the socket path (logged). Between batches only.
    pub(super) fn export_slabs(&mut self) {
        let mut wanted = Vec::new();
        for (range_index, range) in self.engine.ranges().iter().enumerate() {
            for split in 0..range.slabs.len() {
                let unavailable = (range.unavailable | range.rebuilding) & (1 << split) != 0;
                if !unavailable && self.transport.is_unix(range.slabs[split].node) {
                    wanted.push((range_index, split));
                }
            }
        }
        self.export(wanted, &mut NoBuffers);
    }

    /// Maps the slabs rebuilt since the last batch as shared memory.
    pub(super) fn export_rebuilt_slabs(&mut self) {
        let pending = self.engine.take_pending_exports();
        if pending.is_empty() {
            return;
        }
        let wanted = pending.into_iter().filter(|&(range, split)| {
            let range = &self.engine.ranges()[range];
            (range.unavailable | range.rebuilding) & (1 << split) == 0
                && self.transport.is_unix(range.slabs[split].node)
        });
        let wanted: Vec<(usize, usize)> = wanted.collect();
        self.export(wanted, &mut NoBuffers);
    }

    /// Maps the slabs of `wanted` (range, split) as shared memory, with `buffers` those of the
    /// ops in flight.
    pub(super) fn export(&mut self, wanted: Vec<(usize, usize)>, buffers: &mut dyn OpBuffers) {
        for (range, split) in wanted {
            let slab = self.engine.ranges()[range].slabs[split];
            if self.engine.shared_memory_splits(range) & (1 << split) != 0 {
                continue;
            }
            let split_bytes = self.engine.split_bytes_of_range(range);
            let slots = self.engine.pages_per_range_of(range);
            match self.export_slab(slab.node, (slab.slab_id, split_bytes, slots), buffers) {
                Ok(mapping) => self.engine.set_shared_mapping(range, split, mapping),
                Err(error) => {
                    let address = self.engine.node(slab.node).address;
                    tracing::warn!(node = %address, slab_id = slab.slab_id, %error, "slab stays on the socket path")
                }
            }
        }
    }

    fn export_slab(
        &mut self,
        node: NodeId,
        (slab_id, split_bytes, slots): (u32, usize, u64),
        buffers: &mut dyn OpBuffers,
    ) -> Result<ShmSlab, ExportError> {
        let reply = self.control_with(node, &Control::ExportSlab { slab_id }, buffers)?;
        let Control::SlabExported { slab_id: exported, epoch, layout } = reply else {
            return Err(ExportError::UnexpectedReply(reply.kind()));
        };
        // The memfd came with the reply's first byte, so it is queued on the connection.
        let memfd = self.transport.take_fd(node);
        if exported != slab_id {
            return Err(ExportError::WrongSlab { asked: slab_id, exported });
        }
        if layout.split_bytes as usize != split_bytes || u64::from(layout.slots) != slots {
            return Err(ExportError::WrongLayout { slots: layout.slots, split_bytes: layout.split_bytes });
        }
        let memfd = memfd.ok_or(ExportError::NoDescriptor)?;
        let expected = shm::Expected { owner_client_id: self.config.client_id, slab_id, epoch, layout };
        Ok(ShmSlab::map(memfd, node, expected)?)
    }
}

/// Why a slab could not be mapped as shared memory (it then stays on the socket path).
#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error(transparent)]
    Page(#[from] PageError),
    #[error("{0:?} reply to ExportSlab")]
    UnexpectedReply(remem_proto::Kind),
    #[error("asked for slab {asked}, the node exported {exported}")]
    WrongSlab { asked: u32, exported: u32 },
    #[error("the node exported a slab of {slots} splits of {split_bytes} bytes")]
    WrongLayout { slots: u32, split_bytes: u32 },
    #[error("no descriptor came with SlabExported")]
    NoDescriptor,
    #[error(transparent)]
    Map(#[from] shm::ShmError),
}
