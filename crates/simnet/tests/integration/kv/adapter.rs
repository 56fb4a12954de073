//! The kv's page client over the simulator: `remem_kv::PageClient` implemented by running the
//! real client engine (`SimDriver`) against simulated nodes that run the real node core, in
//! simulated time. Glue, not a model: every decision is the engine's and the nodes'.
//!
//! What differs from the poll driver, and why it does not matter to the cache:
//! - Time moves only when the scenario steps the driver ([`SimPageClient::driver_mut`]) or a
//!   blocking call runs the loop (`map_range`, the state region's waits): `on_readable` and
//!   `on_timer` only hand over what the driver finished, as a poll driver's do after its socket
//!   was readable.
//! - The driver keeps each op's page in its own table and the finished read's bytes are copied
//!   into the cache's slot buffer when the op is handed over (one copy per read, test glue only).
//! - Frames leave at submit rather than at the next turn (a poll driver's `submit_unflushed`
//!   batches them per node; the simulated network delays each message on its own anyway).
//!
//! Invariant: every op the cache submitted is either in the driver or handed back exactly once,
//! named by the cache's tag.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use remem_client::engine::{Engine, OpBuffers, OpDone, Submit};
use remem_client::SlabMapFile;
use remem_kv::PageClient;
use remem_simnet::{SimDriver, SimTime, SECOND};

/// The unix second simulated time 0 stands for (any fixed value: a run depends only on its seed).
pub const EPOCH_UNIX_SECONDS: u64 = 1_800_000_000;

/// A `SimDriver` as the cache's page client.
pub struct SimPageClient {
    driver: SimDriver,
    /// The cache's tag of each op in the driver, by the driver's op id.
    tags: BTreeMap<u64, usize>,
    done: Vec<OpDone>,
}

impl SimPageClient {
    pub fn new(driver: SimDriver) -> SimPageClient {
        SimPageClient { driver, tags: BTreeMap::new(), done: Vec::new() }
    }

    pub fn driver(&self) -> &SimDriver {
        &self.driver
    }

    /// The driver, to move simulated time and to inject faults.
    pub fn driver_mut(&mut self) -> &mut SimDriver {
        &mut self.driver
    }

    /// Ops of the cache in the driver.
    pub fn ops_in_driver(&self) -> usize {
        self.tags.len()
    }

    /// Hands every op the driver finished to the cache: a read's bytes into its slot buffer.
    fn collect(&mut self, buffers: &mut dyn OpBuffers) {
        for completion in self.driver.take_completed() {
            let tag =
                self.tags.remove(&completion.id).expect("every op in the driver was submitted by the cache");
            if !completion.is_write && completion.result.is_ok() {
                buffers.read_buffer(tag).copy_from_slice(&completion.data);
            }
            self.done.push(OpDone {
                index: tag,
                result: completion.result,
                latency: Duration::from_nanos(completion.completed_at - completion.submitted_at),
                started: self.driver.instant_at(completion.submitted_at),
                decoded: completion.decoded,
                degraded: completion.degraded,
            });
        }
    }
}

impl PageClient for SimPageClient {
    type MapError = String;

    fn submit_unflushed(&mut self, tag: usize, op: Submit<'_>, _buffers: &mut dyn OpBuffers) -> bool {
        match self.driver.try_submit(op) {
            Some(id) => {
                self.tags.insert(id, tag);
                true
            }
            None => false,
        }
    }

    fn on_readable(&mut self, buffers: &mut dyn OpBuffers) {
        self.collect(buffers);
    }

    fn on_timer(&mut self, buffers: &mut dyn OpBuffers) {
        self.collect(buffers);
    }

    fn completions(&mut self) -> impl Iterator<Item = OpDone> + '_ {
        self.done.drain(..)
    }

    fn in_flight(&self) -> usize {
        self.driver.in_flight()
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.driver.engine().next_deadline()
    }

    fn engine(&mut self) -> &Engine {
        self.driver.engine()
    }

    fn map_range(&mut self, range: usize, _buffers: &mut dyn OpBuffers) -> Result<(), String> {
        self.driver.map_range(range)
    }

    fn release_range(&mut self, range: usize) -> bool {
        self.driver.release_range(range)
    }

    fn slab_map(&mut self) -> Option<SlabMapFile> {
        None
    }

    fn mapped_range_count(&mut self) -> usize {
        let engine = self.driver.engine();
        (0..engine.ranges().len()).filter(|&range| engine.range_mapped(range)).count()
    }

    fn mapped_node_bytes(&mut self) -> u64 {
        let engine = self.driver.engine();
        let slab_bytes = engine.nodes().iter().map(|node| node.info.slab_size_bytes).max().unwrap_or(0);
        let slabs: usize = engine.ranges().iter().map(|range| range.slabs.len()).sum();
        slabs as u64 * slab_bytes
    }

    fn wait_for_io(&mut self, longest: Duration) {
        let until = self.driver.now() + longest.as_nanos() as SimTime;
        self.driver.step(until);
    }

    fn now(&self) -> Instant {
        self.driver.instant_at(self.driver.now())
    }

    fn now_unix(&self) -> u64 {
        EPOCH_UNIX_SECONDS + self.driver.now() / SECOND
    }
}
