//! The remote metadata area (`remote.rs`) against its fault model: torn writes of the newest
//! header and of the last append are passed over, lost pages are errors, pages an older
//! generation left are never replayed, and any page contents load without a panic. Then the
//! whole file system reopened from the area equals the live one.

use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use remem_client::{OpDone, PageError, PageOp};

use super::remote::{AreaError, RemoteArea};
use super::tests::{file_contents, op, run_ops, ME};
use super::{Metadata, PersistError};
use crate::filesystem::FileSystem;
use crate::store::{MemoryStore, PageStore};

/// A page store whose pages outlive the area holding it (the nodes outlive the process).
#[derive(Clone)]
struct Shared(Arc<Mutex<MemoryStore>>);

impl Shared {
    fn new(pages: u64) -> Shared {
        Shared(Arc::new(Mutex::new(MemoryStore::new(4096, pages))))
    }

    fn area(&self) -> RemoteArea {
        RemoteArea::new(Box::new(self.clone())).expect("area")
    }

    fn model(&self) -> std::sync::MutexGuard<'_, MemoryStore> {
        self.0.lock().expect("model")
    }
}

impl PageStore for Shared {
    fn page_bytes(&self) -> usize {
        self.model().page_bytes
    }

    fn page_count(&self) -> u64 {
        self.model().page_count
    }

    fn execute(&mut self, ops: &mut [PageOp<'_>], on_done: &mut dyn FnMut(OpDone)) {
        self.model().execute(ops, on_done)
    }

    fn discard_page(&mut self, page: u64) -> Result<(), PageError> {
        self.model().discard_page(page)
    }
}

/// 2 header pages and two halves of 40.
const PAGES: u64 = 82;

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|at| seed.wrapping_add((at % 251) as u8)).collect()
}

#[test]
fn an_area_reads_back_its_newest_snapshot_and_every_append_in_order() {
    let shared = Shared::new(PAGES);
    let mut area = shared.area();
    let loaded = area.load().expect("load an empty area");
    assert!(loaded.snapshot.is_none() && loaded.journal.is_empty(), "never written: nothing saved");
    assert!(!area.has_room_for(1), "no appends before the first generation");
    area.replace(&bytes(1, 10_000)).expect("generation 1");
    let appends = [bytes(2, 100), bytes(3, 4064), bytes(4, 9_000), bytes(5, 1)];
    for append in &appends {
        area.append(append).expect("append");
    }
    let loaded = shared.area().load().expect("load");
    assert_eq!((loaded.generation, loaded.snapshot.as_deref()), (1, Some(&bytes(1, 10_000)[..])));
    assert_eq!(loaded.journal, appends.concat(), "each append on fresh pages, read back in order");
    assert_eq!(loaded.torn_page, None);

    area.replace(&bytes(6, 5)).expect("generation 2");
    area.append(&bytes(7, 50)).expect("append");
    area.replace(&bytes(8, 70_000)).expect("generation 3, over generation 1's half");
    let loaded = shared.area().load().expect("load");
    assert_eq!((loaded.generation, loaded.snapshot.as_deref()), (3, Some(&bytes(8, 70_000)[..])));
    assert!(loaded.journal.is_empty(), "generation 1's journal pages in the same half are not this one's");
}

#[test]
fn a_torn_newest_header_falls_back_to_the_generation_before_whole() {
    let shared = Shared::new(PAGES);
    let mut area = shared.area();
    area.replace(&bytes(1, 3000)).expect("generation 1");
    area.append(&bytes(2, 200)).expect("append");
    area.replace(&bytes(3, 3000)).expect("generation 2");
    // A crash in the middle of generation 2's header write: page 0 unreadable.
    shared.model().torn.insert(0);
    let loaded = shared.area().load().expect("the older generation loads");
    assert_eq!((loaded.generation, loaded.snapshot.as_deref()), (1, Some(&bytes(1, 3000)[..])));
    assert_eq!(loaded.journal, bytes(2, 200));

    // The next process writes generation 2 again: the torn attempt's pages are never its own.
    let mut next = shared.area();
    next.load().expect("load");
    next.replace(&bytes(4, 10)).expect("generation 2 again");
    let loaded = shared.area().load().expect("load");
    assert_eq!((loaded.generation, loaded.snapshot.as_deref()), (2, Some(&bytes(4, 10)[..])));
    assert!(loaded.journal.is_empty());
}

#[test]
fn a_torn_last_append_ends_the_journal_and_a_lost_page_is_an_error() {
    let shared = Shared::new(PAGES);
    let mut area = shared.area();
    area.replace(&bytes(1, 100)).expect("generation 1");
    area.append(&bytes(2, 300)).expect("append 1 (journal page 0)");
    area.append(&bytes(3, 3 * 4064)).expect("append 2 (journal pages 1-3)");
    // Generation 1 keeps half 1: its snapshot in page 42, journal page 0 in 43.
    shared.model().torn.insert(45);
    let loaded = shared.area().load().expect("load");
    assert_eq!(loaded.torn_page, Some(2));
    assert_eq!(loaded.journal, [bytes(2, 300), bytes(3, 4064)].concat(), "up to the torn page, no further");

    shared.model().torn.clear();
    shared.model().lost.insert(44);
    match shared.area().load() {
        Err(AreaError::Unreadable { page: 44, .. }) => {}
        other => panic!("a lost journal page must be an error, not the journal's end: {other:?}"),
    }
    shared.model().lost = [1].into();
    assert!(matches!(shared.area().load(), Err(AreaError::Unreadable { page: 1, .. })), "a lost header too");
    shared.model().lost = [42].into();
    assert!(
        matches!(shared.area().load(), Err(AreaError::Unreadable { page: 42, .. })),
        "a lost snapshot page"
    );
}

#[test]
fn an_area_refuses_what_does_not_fit() {
    assert!(matches!(RemoteArea::new(Box::new(Shared::new(20))), Err(AreaError::TooSmall { pages: 20, .. })));
    let shared = Shared::new(PAGES);
    let mut area = shared.area();
    assert!(matches!(area.replace(&bytes(1, 25 * 4096)), Err(AreaError::Full { .. })));
    area.replace(&bytes(1, 24 * 4096)).expect("a snapshot that leaves 16 journal pages");
    assert!(area.has_room_for(16 * 4064) && !area.has_room_for(16 * 4064 + 1));
    area.append(&bytes(2, 8 * 4064)).expect("append");
    assert!(area.half_used(), "half of the journal's room used: time to compact");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever the pages hold (here: a valid area with bytes overwritten at random), loading
    /// returns a generation or an error, never panics.
    #[test]
    fn any_page_contents_load_without_a_panic(
        damage in prop::collection::vec((0u64..PAGES, 0usize..4096, any::<u8>()), 0..40),
        copies in prop::collection::vec((0u64..PAGES, 0u64..PAGES), 0..6),
    ) {
        let shared = Shared::new(PAGES);
        let mut area = shared.area();
        area.replace(&bytes(1, 5000)).expect("generation 1");
        area.append(&bytes(2, 5000)).expect("append");
        area.replace(&bytes(3, 100)).expect("generation 2");
        area.append(&bytes(4, 100)).expect("append");
        {
            let mut model = shared.model();
            for (from, to) in copies {
                let page = model.pages.get(&from).cloned().unwrap_or_else(|| vec![0; 4096]);
                model.pages.insert(to, page);
            }
            for (page, at, value) in damage {
                model.pages.entry(page).or_insert_with(|| vec![0; 4096])[at] = value;
            }
        }
        let _ = shared.area().load();
    }

    /// The file system reopened from the remote area (the nodes kept its pages; the process and
    /// its host are gone) has the live one's metadata exactly and every file's bytes. The area
    /// is small, so appends run out of room and compact in their place.
    #[test]
    fn a_file_system_reopened_from_the_remote_area_equals_the_live_one(
        ops in prop::collection::vec(op(), 1..50),
        compact_often in any::<bool>(),
    ) {
        let meta = Shared::new(PAGES);
        let (mut live, _) = FileSystem::open_saved(super::tests::store(96), ME, Metadata::Remote(meta.area()))
            .expect("open empty");
        if compact_often {
            live.journal.as_mut().expect("journal").compact_at_bytes = 1;
        }
        for op in &ops {
            run_ops(&mut live, std::slice::from_ref(op));
            live.maintain();
            prop_assert!(live.start_sync(false).expect("sync").is_none(), "a remote journal is always durable");
        }
        // Times of overwrites are journaled lazily, at the latest by a sync (fsync): this one
        // writes them to the area, and then there is nothing else to flush.
        live.sync().expect("sync");
        let expected = live.snapshot_bytes(0);
        let files = file_contents(&mut live);
        let pages = std::mem::take(&mut live.store.pages);
        // Killed: not unmounted; no local state at all.
        drop(live);
        let mut reopened_store = super::tests::store(96);
        reopened_store.pages = pages;
        let (mut reopened, report) = FileSystem::open_saved(reopened_store, ME, Metadata::Remote(meta.area()))
            .expect("reopen");
        prop_assert!(report.torn_tail.is_none());
        prop_assert_eq!(reopened.snapshot_bytes(0), expected, "metadata differs after reopening");
        for (number, bytes) in files {
            let size = bytes.len();
            prop_assert_eq!(reopened.read(number, 0, size).expect("read").to_vec(), bytes, "inode {}", number);
        }
    }
}

#[test]
fn a_snapshot_too_large_for_the_area_fails_the_change_not_the_process() {
    // 2 + 2 x 17 pages: a half holds a one-page snapshot and 16 journal pages.
    let meta = Shared::new(36);
    let (mut fs, _) =
        FileSystem::open_saved(super::tests::store(4096), ME, Metadata::Remote(meta.area())).expect("open");
    let mut failed = None;
    for index in 0..2000 {
        let name = format!("a-rather-long-file-name-to-fill-the-snapshot-{index:05}");
        if let Err(error) = fs.create_file(crate::namespace::ROOT_INODE, std::ffi::OsStr::new(&name), ME) {
            failed = Some((index, error));
            break;
        }
    }
    let (index, error) = failed.expect("the area fills up");
    assert!(error.to_string().contains("--metadata-size"), "{index}: {error}");
    assert!(
        fs.create_file(crate::namespace::ROOT_INODE, std::ffi::OsStr::new("x"), ME).is_err(),
        "refused from then on"
    );
    drop(fs);
    // The area's last generation is whole, but a process opening it must write a new one, which
    // does not fit either: a clear error, not a panic and not an empty file system.
    match FileSystem::open_saved(super::tests::store(4096), ME, Metadata::Remote(meta.area())) {
        Err(error @ PersistError::Remote(AreaError::Full { .. })) => {
            assert!(error.to_string().contains("--metadata-size"), "{error}")
        }
        Err(error) => panic!("{error}"),
        Ok(_) => panic!("a snapshot that does not fit cannot be written"),
    }
    let loaded = meta.area().load().expect("the last whole generation loads");
    assert!(loaded.snapshot.is_some());
}

#[test]
fn records_the_nodes_did_not_take_are_written_before_the_next_once_they_are_back() {
    use crate::namespace::ROOT_INODE;
    use std::ffi::OsStr;
    let meta = Shared::new(PAGES);
    let (mut fs, _) =
        FileSystem::open_saved(super::tests::store(64), ME, Metadata::Remote(meta.area())).expect("open");
    fs.create_file(ROOT_INODE, OsStr::new("a"), ME).expect("a");
    meta.model().failing = true;
    assert!(fs.create_file(ROOT_INODE, OsStr::new("b"), ME).is_err(), "EIO while the area's nodes are gone");
    assert!(fs.start_sync(false).is_err(), "fsync says the metadata is not on the nodes");
    meta.model().failing = false;
    assert!(fs.start_sync(false).expect("fsync once they are back").is_none());
    fs.create_file(ROOT_INODE, OsStr::new("c"), ME).expect("c");
    meta.model().failing = true;
    assert!(fs.create_file(ROOT_INODE, OsStr::new("d"), ME).is_err());
    meta.model().failing = false;
    fs.create_file(ROOT_INODE, OsStr::new("e"), ME).expect("e, after d's records");
    let expected = fs.snapshot_bytes(0);
    let pages = std::mem::take(&mut fs.store.pages);
    drop(fs);
    let mut store = super::tests::store(64);
    store.pages = pages;
    let (reopened, report) =
        FileSystem::open_saved(store, ME, Metadata::Remote(meta.area())).expect("reopen");
    assert_eq!(report.files, 5, "b and d failed their callers, but memory had them and so does the journal");
    assert_eq!(reopened.snapshot_bytes(0), expected);
}

#[test]
fn with_sync_only_flushes_a_change_reaches_the_area_at_the_next_sync_and_not_before() {
    use crate::namespace::ROOT_INODE;
    use std::ffi::OsStr;
    let meta = Shared::new(PAGES);
    let area = meta.area().flush_on_sync_only();
    let (mut fs, _) =
        FileSystem::open_saved(super::tests::store(64), ME, Metadata::Remote(area)).expect("open");
    fs.create_file(ROOT_INODE, OsStr::new("synced"), ME).expect("create");
    let writes_before = meta.model().ops_executed;
    fs.create_file(ROOT_INODE, OsStr::new("also-synced"), ME).expect("create");
    assert_eq!(meta.model().ops_executed, writes_before, "an append waits for the sync");
    assert!(fs.start_sync(false).expect("fsync").is_none());
    assert!(meta.model().ops_executed > writes_before, "the sync wrote it");
    fs.create_file(ROOT_INODE, OsStr::new("not-synced"), ME).expect("create");
    let pages = std::mem::take(&mut fs.store.pages);
    drop(fs); // killed before the next sync
    let mut store = super::tests::store(64);
    store.pages = pages;
    let (reopened, report) =
        FileSystem::open_saved(store, ME, Metadata::Remote(meta.area())).expect("reopen");
    assert_eq!(report.files, 2, "the synced files, not the one created after the last sync");
    assert!(reopened.lookup(ROOT_INODE, OsStr::new("also-synced")).is_ok());
    assert!(reopened.lookup(ROOT_INODE, OsStr::new("not-synced")).is_err());

    // Many records waiting for one sync: all of them reach the area.
    let meta = Shared::new(PAGES);
    let area = meta.area().flush_on_sync_only();
    let (mut fs, _) =
        FileSystem::open_saved(super::tests::store(4096), ME, Metadata::Remote(area)).expect("open");
    for index in 0..400 {
        let name = format!("a-name-long-enough-to-fill-the-journal-half-{index:04}");
        fs.create_file(ROOT_INODE, OsStr::new(&name), ME).expect("create");
    }
    fs.sync().expect("sync");
    let (reopened, report) =
        FileSystem::open_saved(super::tests::store(4096), ME, Metadata::Remote(meta.area())).expect("reopen");
    assert_eq!(report.files, 400);
    drop(reopened);
}
