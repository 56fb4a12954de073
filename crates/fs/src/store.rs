//! The page store under the file system: the front ends' one trait and its in-memory model
//! (`remem_frontend::page_store`, whose contract the file system relies on), and the client of
//! a file system that survives restarts, which follows its cluster's membership and saves its
//! slab map after rebuilds, in its home (a local file, or etcd).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use remem_client::{Client, OpDone, PageError, PageOp};
use remem_frontend::export_home::{ExportHome, RebuildSaves};
pub use remem_frontend::page_store::{MemoryStore, PageStore};

/// Set once another process owns the file system (etcd fenced this one): from then on every
/// page op fails and the mount is taken down (docs/FS.md, "Host loss").
#[derive(Debug, Default)]
pub struct Fence {
    fenced: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Fence {
    pub fn set(&self, reason: String) {
        if let Ok(mut held) = self.reason.lock() {
            held.get_or_insert(reason);
        }
        self.fenced.store(true, Ordering::Release);
    }

    /// Why this process was fenced, if it was.
    pub fn reason(&self) -> Option<String> {
        if !self.fenced.load(Ordering::Acquire) {
            return None;
        }
        self.reason.lock().ok().and_then(|reason| reason.clone())
    }

    fn is_set(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }
}

/// The remem client of a file system that survives restarts, with its home: nodes new in the
/// cluster file (or etcd) join it, its slab map is saved again after every rebuild (rebuilds
/// move slabs) so a restart finds the pages where they are now, and a fenced home stops it.
pub struct HomedClient {
    pub client: Client,
    home: Box<dyn ExportHome>,
    rebuilds: RebuildSaves,
    /// "the file system's client", "the metadata client": for messages.
    what: &'static str,
    fence: Arc<Fence>,
}

impl HomedClient {
    /// Wraps `client`, whose map its home holds already (saved when it was made or opened).
    pub fn new(
        client: Client,
        home: Box<dyn ExportHome>,
        what: &'static str,
        fence: Arc<Fence>,
    ) -> HomedClient {
        let rebuilds = RebuildSaves::new(&client);
        HomedClient { client, home, rebuilds, what, fence }
    }
}

impl PageStore for HomedClient {
    fn page_bytes(&self) -> usize {
        self.client.page_bytes()
    }

    fn page_count(&self) -> u64 {
        self.client.page_count()
    }

    fn execute(&mut self, ops: &mut [PageOp<'_>], on_done: &mut dyn FnMut(OpDone)) {
        if !self.fence.is_set() {
            return self.client.execute(ops, on_done);
        }
        // Fenced: another process serves these pages now; write nothing, read nothing.
        let started = std::time::Instant::now();
        for index in 0..ops.len() {
            let result = Err(PageError::Refused {
                address: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
                code: "fenced".into(),
                message: "another remem fs owns this file system now".into(),
            });
            on_done(OpDone {
                index,
                result,
                latency: started.elapsed(),
                started,
                decoded: false,
                degraded: false,
            });
        }
    }

    fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        self.client.discard_page(page)
    }

    fn background(&mut self) {
        self.client.poll_background(std::time::Duration::ZERO);
        let home = &mut self.home;
        self.rebuilds.after_rebuilds(&self.client, |client| home.save_map(&client.slab_map()));
        let nodes = self.home.new_nodes();
        let home = &mut self.home;
        remem_frontend::cluster_watch::hand_new_nodes(nodes, &mut self.client, self.what, |address| {
            home.joined(address)
        });
        if let Some(reason) = self.home.fenced() {
            self.fence.set(reason);
        } else if let Some(reason) = self.client.fenced_at_node() {
            self.fence.set(format!("{} at a node: {reason}", self.what));
        }
    }
}
