//! The resource monitor inside a real node, reading a fake `/proc` and `/sys/fs/cgroup` tree
//! (`ResourceMonitorConfig::filesystem_root`) so that a test decides how much memory the "host"
//! has: memory source detection, pre-allocation into the pool and its capacity cap, and batch
//! eviction of the least active slabs below the headroom. Every wait has a deadline.

use crate::common;

use common::*;
use remem_node::{MemorySource, Node, NodeConfig, NodeHandle, ResourceMonitorConfig};
use remem_proto::blocking;
use remem_proto::*;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SLAB: u64 = 1 << 20;
const SPLIT: u32 = 512;
/// One 1 MiB slab of 512-byte splits plus its metadata.
/// One slab's memfd: split bytes, 5 bytes of metadata per slot, the shared-memory header.
fn footprint() -> u64 {
    remem_proto::shm::ShmLayout::new(SLAB, SPLIT).unwrap().total_bytes
}

/// A fake filesystem root, removed on drop.
struct FakeHost {
    root: PathBuf,
}

impl FakeHost {
    fn new(name: &str) -> FakeHost {
        let root = std::env::temp_dir().join(format!("remem-monitor-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proc/self")).unwrap();
        std::fs::write(root.join("proc/self/cgroup"), "4:memory:/\n0::/\n").unwrap();
        FakeHost { root }
    }

    /// Writes /proc/meminfo atomically (rename), so the monitor never reads half a file.
    fn set_meminfo(&self, total_mib: u64, available_mib: u64) {
        let text = format!(
            "MemTotal:       {} kB\nMemFree:        1 kB\nMemAvailable:   {} kB\n",
            total_mib * 1024,
            available_mib * 1024
        );
        let temporary = self.root.join("proc/meminfo.new");
        std::fs::write(&temporary, text).unwrap();
        std::fs::rename(temporary, self.root.join("proc/meminfo")).unwrap();
    }

    fn write(&self, relative: &str, text: &str) {
        let path = self.root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

struct MonitoredNode {
    addr: SocketAddr,
    handle: NodeHandle,
    shutdown: Arc<AtomicBool>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl MonitoredNode {
    fn start(root: &Path, capacity_bytes: u64, period: Duration) -> MonitoredNode {
        let node = Node::bind(NodeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            capacity_bytes,
            slab_size_bytes: SLAB,
            failure_domain: String::new(),
            secret: secret(),
            node_id: NODE_ID,
            max_connections: 16,
            fault_injection: false,
            unix_socket: None,
            lease_grace: remem_node::leases::DEFAULT_LEASE_GRACE,
            lease_timeout: remem_node::leases::DEFAULT_LEASE_TIMEOUT,
            encrypt: false,
            resource_monitor: Some(ResourceMonitorConfig {
                period,
                filesystem_root: root.to_owned(),
                ..ResourceMonitorConfig::default()
            }),
        })
        .unwrap();
        let addr = node.local_addr();
        let handle = node.handle();
        let shutdown = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&shutdown);
        let thread = Some(std::thread::spawn(move || node.run(flag)));
        MonitoredNode { addr, handle, shutdown, thread }
    }

    fn client(&self, client_id: u64) -> Client {
        let mut stream = std::net::TcpStream::connect(self.addr).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        blocking::handshake(&mut stream, &secret(), client_id).unwrap();
        Client::new(stream)
    }
}

impl Drop for MonitoredNode {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("node thread panicked").expect("node run failed");
        }
    }
}

/// Waits up to 10 s for `condition`.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn memory_source_is_the_nearest_cgroup_limit_below_the_host_else_meminfo() {
    let host = FakeHost::new("detect");
    host.set_meminfo(4096, 2048);
    let detect = || MemorySource::detect(&host.root).unwrap();
    assert_eq!(detect(), MemorySource::MemInfo { path: host.root.join("proc/meminfo") });

    // cgroup v1, the node's own group unlimited but its parent limited.
    host.write("proc/self/cgroup", "4:memory:/jobs/node\n0::/\n");
    host.write("sys/fs/cgroup/memory/jobs/node/memory.limit_in_bytes", "9223372036854771712\n");
    host.write("sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", "1073741824\n");
    host.write("sys/fs/cgroup/memory/jobs/memory.usage_in_bytes", "536870912\n");
    let dir = host.root.join("sys/fs/cgroup/memory/jobs");
    assert_eq!(detect(), MemorySource::CgroupV1 { dir: dir.clone() });
    let reading = MemorySource::CgroupV1 { dir }.read().unwrap();
    assert_eq!((reading.limit_bytes, reading.free_bytes), (1 << 30, 1 << 29));

    // A v2 limit wins over v1, under /sys/fs/cgroup/unified in a hybrid layout.
    host.write("proc/self/cgroup", "4:memory:/jobs/node\n0::/svc\n");
    host.write("sys/fs/cgroup/unified/svc/memory.max", "2147483648\n");
    host.write("sys/fs/cgroup/unified/svc/memory.current", "garbage\n");
    let dir = host.root.join("sys/fs/cgroup/unified/svc");
    assert_eq!(detect(), MemorySource::CgroupV2 { dir: dir.clone() });
    let error = MemorySource::CgroupV2 { dir }.read().unwrap_err();
    assert!(error.to_string().contains("memory.current"), "{error}");

    // A limit above the host's memory is no limit: meminfo is tighter.
    host.write("sys/fs/cgroup/unified/svc/memory.max", "99999999999999\n");
    host.write("sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", "max\n");
    assert_eq!(detect(), MemorySource::MemInfo { path: host.root.join("proc/meminfo") });

    // No meminfo at all: the monitor cannot run, and says so.
    std::fs::remove_file(host.root.join("proc/meminfo")).unwrap();
    assert!(MemorySource::detect(&host.root).is_err());
}

#[test]
fn preallocated_slabs_fill_the_pool_serve_map_slab_zeroed_and_stay_within_capacity() {
    let host = FakeHost::new("pool");
    host.set_meminfo(16 * 1024, 12 * 1024);
    // Room for exactly three slabs with their metadata.
    let node = MonitoredNode::start(&host.root, 3 * footprint(), Duration::from_millis(20));
    wait_until("the pool holds 2 slabs", || node.handle.pooled_slabs() == 2);
    let info = node.handle.info();
    assert_eq!(info.free_bytes, 3 * footprint(), "pooled slabs count as free for clients");

    let mut client = node.client(5);
    let (first, slots) = client.map_slab(SPLIT, 0, 0);
    assert_eq!(slots as u64, SLAB / SPLIT as u64);
    // A slab from the pool is indistinguishable from a fresh one: unwritten and zero.
    for slot in [0, slots / 2, slots - 1] {
        let (meta, payload) = client.read_split(first, slot).unwrap();
        assert_eq!(meta, SplitMeta { version: 0, checksum: 0 });
        assert!(payload.iter().all(|&byte| byte == 0));
    }
    // The pool refills to 2 (1 mapped + 2 pooled fit), then one more map leaves room for none.
    wait_until("the pool refills", || node.handle.pooled_slabs() == 2);
    client.map_slab(SPLIT, 1, 0);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(node.handle.pooled_slabs(), 1, "capacity caps pool plus mapped slabs");
    client.map_slab(SPLIT, 2, 0);
    let reply =
        client.call(&Control::MapSlab { split_bytes: SPLIT, split_index: 3, first_page: 0, range_id: 0 });
    assert!(matches!(reply, Control::Error { code: ErrorCode::NoCapacity, .. }), "{reply:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(node.handle.pooled_slabs(), 0);
    let info = node.handle.info();
    assert_eq!((info.slabs_mapped, info.free_bytes), (3, 0));
}

#[test]
fn below_headroom_the_pool_goes_first_then_the_least_active_slabs_are_evicted_and_mapping_refused() {
    let host = FakeHost::new("evict");
    // 1 GiB host, 25% headroom = 256 MiB; plenty free to start with.
    host.set_meminfo(1024, 900);
    // A period long enough that the checks below run between two of them, even on a busy machine:
    // the fake host does not see evictions free memory, so a second period would evict more.
    let node = MonitoredNode::start(&host.root, 16 * footprint(), Duration::from_millis(1000));
    wait_until("the pool holds 2 slabs", || node.handle.pooled_slabs() == 2);

    // Client 1 owns two idle slabs, client 2 two busy ones.
    let mut idle = node.client(1);
    let idle_slabs = [idle.map_slab(SPLIT, 0, 0).0, idle.map_slab(SPLIT, 1, 0).0];
    let mut busy = node.client(2);
    let busy_slabs = [busy.map_slab(SPLIT, 0, 0).0, busy.map_slab(SPLIT, 1, 0).0];
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                for slab_id in busy_slabs {
                    busy.read_split(slab_id, 7).unwrap();
                }
            }
        })
    };
    wait_until("the pool refills", || node.handle.pooled_slabs() == 2);
    let mapped_before = node.handle.info().slabs_mapped;
    assert_eq!(mapped_before, 4);

    // 4 MiB short of the headroom: the 2 pooled slabs, then 2 of the 4 mapped (E = 2, E' = 2:
    // all four sampled, the two idle ones lose).
    host.set_meminfo(1024, 256 - 4);
    wait_until("two slabs are evicted", || node.handle.info().slabs_mapped <= 2);
    assert_eq!(node.handle.info().slabs_mapped, 2, "exactly E = 2 evicted");
    assert_eq!(node.handle.pooled_slabs(), 0, "the pool was freed first");
    // While the host is below the headroom, nothing new is mapped.
    let mut third = node.client(3);
    let reply =
        third.call(&Control::MapSlab { split_bytes: SPLIT, split_index: 0, first_page: 0, range_id: 0 });
    assert!(matches!(reply, Control::Error { code: ErrorCode::NoCapacity, .. }), "{reply:?}");
    assert_eq!(node.handle.info().free_bytes, 0, "a host below its headroom lends nothing");
    // Memory comes back before the next period could evict more.
    host.set_meminfo(1024, 900);
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("the busy reader failed");

    assert_eq!(node.handle.info().slabs_mapped, 2, "no second wave of evictions");
    // The idle owner heard of both evictions, the busy one kept its slabs.
    let mut evicted = Vec::new();
    for _ in 0..2 {
        let (header, notice) = blocking::read_control(&mut idle.stream, &mut idle.body).unwrap();
        assert_eq!(header.request_id, 0);
        let Control::SlabEvicted { slab_id } = notice else { panic!("expected SlabEvicted, got {notice:?}") };
        evicted.push(slab_id);
    }
    evicted.sort_unstable();
    let mut expected = idle_slabs;
    expected.sort_unstable();
    assert_eq!(evicted, expected);
    let mut busy = node.client(2);
    for slab_id in busy_slabs {
        busy.read_split(slab_id, 0).unwrap();
    }
    // Above the headroom again, mapping works and the pool refills.
    wait_until("mapping works again", || {
        matches!(
            third.call(&Control::MapSlab { split_bytes: SPLIT, split_index: 0, first_page: 0, range_id: 0 }),
            Control::SlabMapped { .. }
        )
    });
    wait_until("the pool refills", || node.handle.pooled_slabs() == 2);
}

/// Seed 000's batch eviction asks the owners: a slab the node sees as idle (its owner reaches it
/// some other way, e.g. shared memory) survives when its owner reports it busy, and the idle
/// ones go. Only the connection that volunteered (`AnswerActivity`) is asked.
#[test]
fn owners_are_asked_and_a_slab_they_report_busy_is_kept() {
    owners_are_asked(false);
}

/// The same with a second volunteering connection of the owner that answers 0 to every
/// question (another engine of `remem nbd --engines`, which does not hold these slabs): both are
/// asked, the highest answer counts, and the busy slab is still kept.
#[test]
fn every_volunteering_connection_of_an_owner_is_asked_and_the_busiest_answer_counts() {
    owners_are_asked(true);
}

/// Answers every `SlabActivityQuery` on `client`'s connection with 0 until `stop`; returns the
/// slabs it was asked about.
fn answer_zero(mut client: Client, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<u32>> {
    std::thread::spawn(move || {
        client.stream.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut asked = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            match blocking::read_control(&mut client.stream, &mut client.body) {
                Ok((header, Control::SlabActivityQuery { slab_id })) => {
                    asked.push(slab_id);
                    let answer = Control::SlabActivity { slab_id, accesses: 0 };
                    blocking::write_control(&mut client.stream, header.request_id, &answer).unwrap();
                }
                Ok(_) | Err(_) => continue, // eviction notices, timeouts
            }
        }
        asked
    })
}

fn owners_are_asked(blind_volunteer: bool) {
    let host = FakeHost::new(if blind_volunteer { "ask-blind" } else { "ask" });
    host.set_meminfo(1024, 900);
    let node = MonitoredNode::start(&host.root, 16 * footprint(), Duration::from_millis(1000));
    wait_until("the pool holds 2 slabs", || node.handle.pooled_slabs() == 2);

    // Client 1 volunteers and owns two slabs; it will report the first busy, the second idle.
    let mut owner = node.client(1);
    assert_eq!(owner.call(&Control::AnswerActivity), Control::Ok);
    let busy_slab = owner.map_slab(SPLIT, 0, 0).0;
    let idle_slab = owner.map_slab(SPLIT, 1, 0).0;
    // A second connection of client 1 that never volunteered: it must never be asked.
    let mut side = node.client(1);
    side.stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    // Client 2 owns two slabs and does not answer questions.
    let mut other = node.client(2);
    let other_slabs = [other.map_slab(SPLIT, 0, 0).0, other.map_slab(SPLIT, 1, 0).0];
    wait_until("the pool refills", || node.handle.pooled_slabs() == 2);

    let stop = Arc::new(AtomicBool::new(false));
    let blind = blind_volunteer.then(|| {
        let mut blind = node.client(1);
        assert_eq!(blind.call(&Control::AnswerActivity), Control::Ok);
        answer_zero(blind, Arc::clone(&stop))
    });
    let answerer = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            owner.stream.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            let (mut asked, mut evicted) = (Vec::new(), Vec::new());
            let mut total = 0u64;
            let deadline = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let (header, message) = match blocking::read_control(&mut owner.stream, &mut owner.body) {
                    Ok(frame) => frame,
                    Err(_) => continue, // the read timed out
                };
                match message {
                    Control::SlabActivityQuery { slab_id } => {
                        asked.push(slab_id);
                        total += 1000;
                        let accesses = if slab_id == busy_slab { total } else { 0 };
                        let answer = Control::SlabActivity { slab_id, accesses };
                        blocking::write_control(&mut owner.stream, header.request_id, &answer).unwrap();
                    }
                    Control::SlabEvicted { slab_id } => evicted.push(slab_id),
                    other => panic!("unexpected {other:?}"),
                }
            }
            (asked, evicted)
        })
    };

    // Short of the headroom by two slabs beyond the pool: E = 2, E' = 2, all four sampled.
    host.set_meminfo(1024, 256 - 4);
    wait_until("two slabs are evicted", || node.handle.info().slabs_mapped <= 2);
    assert_eq!(node.handle.info().slabs_mapped, 2, "exactly E = 2 evicted");
    host.set_meminfo(1024, 900);
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let (mut asked, evicted) = answerer.join().expect("the answering owner failed");
    asked.sort_unstable();
    asked.dedup();
    let mut owned = vec![busy_slab, idle_slab];
    owned.sort_unstable();
    assert_eq!(asked, owned, "the owner was asked about each of its sampled slabs");
    if let Some(blind) = blind {
        let mut blind_asked = blind.join().expect("the blind volunteer failed");
        blind_asked.sort_unstable();
        blind_asked.dedup();
        assert_eq!(blind_asked, owned, "the second volunteer was asked too");
    }
    assert!(!evicted.contains(&busy_slab), "the slab its owner reports busy is kept: {evicted:?}");
    // Two of the three idle slabs (the owner's idle one, the silent client's two) went, ties
    // broken at random; the busy one stays readable. Fresh connections: the old ones may hold
    // eviction notices unread.
    let mut check = node.client(1);
    assert!(check.read_split(busy_slab, 0).is_ok());
    let owner_idle_left = usize::from(check.read_split(idle_slab, 0).is_ok());
    assert_eq!(owner_idle_left, 1 - evicted.len(), "the owner heard of its evicted slab");
    let mut other = node.client(2);
    let other_left = other_slabs.iter().filter(|&&slab| other.read_split(slab, 0).is_ok()).count();
    assert_eq!(owner_idle_left + other_left, 1, "exactly two of the three idle slabs went");
    // The side connection of the same client was never asked.
    let mut body = Vec::new();
    loop {
        match blocking::read_control(&mut side.stream, &mut body) {
            Ok((_, Control::SlabEvicted { .. })) => continue,
            Ok((_, other)) => panic!("the side connection got {other:?}"),
            Err(_) => break,
        }
    }
}
