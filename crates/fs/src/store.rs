//! The page store under the file system: the front ends' one trait and its in-memory model
//! (`remem_frontend::page_store`, whose contract the file system relies on), and the client of
//! a file system that survives restarts, which saves its slab map after rebuilds.

use std::path::{Path, PathBuf};

use remem_client::{Client, OpDone, PageError, PageOp, SlabMapError};
pub use remem_frontend::page_store::{MemoryStore, PageStore};

/// The remem client of a file system that survives restarts: its slab map is saved when it is
/// made and again after every rebuild (rebuilds move slabs), so a restart finds the pages
/// where they are now.
pub struct SavedMapClient {
    pub client: Client,
    map_path: PathBuf,
    rebuilds: remem_frontend::export_home::RebuildSaves,
}

impl SavedMapClient {
    /// Wraps `client` and saves its map to `map_path` at once (durably).
    pub fn new(client: Client, map_path: &Path) -> Result<SavedMapClient, SlabMapError> {
        let rebuilds = remem_frontend::export_home::RebuildSaves::new(&client);
        let saved = SavedMapClient { client, map_path: map_path.to_owned(), rebuilds };
        saved.save()?;
        Ok(saved)
    }

    fn save(&self) -> Result<(), SlabMapError> {
        // Durable: the file synced before its rename, the directory after (SlabMapFile::save).
        self.client.save_map(&self.map_path)
    }
}

impl PageStore for SavedMapClient {
    fn page_bytes(&self) -> usize {
        self.client.page_bytes()
    }

    fn page_count(&self) -> u64 {
        self.client.page_count()
    }

    fn execute(&mut self, ops: &mut [PageOp<'_>], on_done: &mut dyn FnMut(OpDone)) {
        self.client.execute(ops, on_done);
    }

    fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        self.client.discard_page(page)
    }

    fn background(&mut self) {
        self.client.poll_background(std::time::Duration::ZERO);
        let map_path = &self.map_path;
        // Durable: the file synced before its rename, the directory after (SlabMapFile::save).
        self.rebuilds.after_rebuilds(&self.client, |client| client.save_map(map_path));
    }
}
