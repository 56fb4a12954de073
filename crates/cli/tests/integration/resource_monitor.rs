//! The resource monitor against real memory pressure: one `remem node` process runs in a fresh
//! memory cgroup limited to 1 GiB, beside ten ordinary nodes; an EC(8,2) client fills it with
//! slabs; a bounded memory hog (`remem memory-hog`) joins the cgroup and takes it below the 25%
//! headroom. The node must evict slabs (the pool first), the client must rebuild them elsewhere,
//! and every page must read back byte-exact.
//!
//! Needs root and a writable cgroup memory hierarchy (v1 at /sys/fs/cgroup/memory, else v2 with
//! the memory controller); without them the test fails and says why. Every process it starts is
//! killed by PID and the cgroup removed, and every wait has a deadline.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use remem::launcher::{ClusterOptions, LocalCluster};
use remem::pattern;
use remem_client::{Client, ClientConfig, NodeAddress, PageOp, Shape};
use remem_placement::LeastLoaded;

use crate::common::KillOnDrop;

const EC82: Shape = Shape { data_splits: 8, parity_splits: 2, extra_reads: 1 };
const MIB: u64 = 1 << 20;
/// 4 MiB slabs of 512-byte splits: a range is 8192 pages (32 MiB).
const SLAB_BYTES: u64 = 4 * MIB;
const CGROUP_LIMIT_BYTES: u64 = 1 << 30;
const HEADROOM_PERCENT: u64 = 25;
const PATTERN_SEED: u64 = 33;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_remem"))
}

/// A memory cgroup created for the test; removed on drop (its processes must be gone by then).
struct TestCgroup {
    dir: PathBuf,
    version: u8,
}

impl TestCgroup {
    fn create(name: &str, limit_bytes: u64) -> Result<TestCgroup, String> {
        let v1_root = Path::new("/sys/fs/cgroup/memory");
        if v1_root.join("memory.limit_in_bytes").exists() {
            let dir = v1_root.join(name);
            let cgroup = TestCgroup::make(dir, 1)?;
            cgroup.write("memory.limit_in_bytes", &limit_bytes.to_string())?;
            return Ok(cgroup);
        }
        for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            let root = Path::new(root);
            let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            if controllers.split_whitespace().any(|controller| controller == "memory") {
                std::fs::write(root.join("cgroup.subtree_control"), "+memory").map_err(|error| {
                    format!("enabling the memory controller under {}: {error}", root.display())
                })?;
                let cgroup = TestCgroup::make(root.join(name), 2)?;
                cgroup.write("memory.max", &limit_bytes.to_string())?;
                return Ok(cgroup);
            }
        }
        Err("no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory and no cgroup v2 with the memory controller".to_owned())
    }

    fn make(dir: PathBuf, version: u8) -> Result<TestCgroup, String> {
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).map_err(|error| format!("creating cgroup {}: {error}", dir.display()))?;
        Ok(TestCgroup { dir, version })
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        std::fs::write(self.dir.join(file), value)
            .map_err(|error| format!("writing {value} to {}: {error}", self.dir.join(file).display()))
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    fn usage_bytes(&self) -> u64 {
        let file = if self.version == 1 { "memory.usage_in_bytes" } else { "memory.current" };
        let text = std::fs::read_to_string(self.dir.join(file)).expect("cgroup usage readable");
        text.trim().parse().expect("cgroup usage is a number")
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // The processes were killed and reaped by their guards; the kernel may take a moment to
        // let go of the group.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if self.dir.exists() {
            eprintln!("could not remove cgroup {}", self.dir.display());
        }
    }
}

/// Reads lines from `child`'s stdout until one starts with `prefix`, within `timeout`.
fn wait_for_line(child: &mut Child, prefix: &str, timeout: Duration) -> String {
    let stdout = child.stdout.take().expect("stdout piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    let prefix_owned = prefix.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with(&prefix_owned) {
                let _ = sender.send(line);
            }
        }
    });
    receiver.recv_timeout(timeout).unwrap_or_else(|_| panic!("no {prefix:?} line within {timeout:?}"))
}

/// The model of remote memory: every page written once with generation 1.
fn write_all(client: &mut Client, pages: u64) {
    let batch = 1024;
    for start in (0..pages).step_by(batch) {
        let end = (start + batch as u64).min(pages);
        let buffers: Vec<Vec<u8>> = (start..end)
            .map(|page| {
                let mut buffer = vec![0; 4096];
                pattern::fill(&mut buffer, page, 1, PATTERN_SEED);
                buffer
            })
            .collect();
        let mut ops: Vec<PageOp<'_>> =
            (start..end).zip(&buffers).map(|(page, data)| PageOp::Write { page, data }).collect();
        let mut errors = Vec::new();
        client.execute(&mut ops, |done| {
            if let Err(error) = done.result {
                errors.push(error.to_string());
            }
        });
        assert!(errors.is_empty(), "writes failed: {:?}", &errors[..errors.len().min(3)]);
    }
}

/// Reads every page and returns how many differ from the model.
fn count_mismatches(client: &mut Client, pages: u64) -> u64 {
    let batch = 1024;
    let mut mismatches = 0;
    let mut scratch = vec![0; 4096];
    for start in (0..pages).step_by(batch) {
        let end = (start + batch as u64).min(pages);
        let mut buffers = vec![vec![0u8; 4096]; (end - start) as usize];
        let mut errors = Vec::new();
        {
            let mut ops: Vec<PageOp<'_>> =
                (start..end).zip(buffers.iter_mut()).map(|(page, buf)| PageOp::Read { page, buf }).collect();
            client.execute(&mut ops, |done| {
                if let Err(error) = done.result {
                    errors.push(error.to_string());
                }
            });
        }
        assert!(errors.is_empty(), "reads failed: {:?}", &errors[..errors.len().min(3)]);
        for (page, buffer) in (start..end).zip(&buffers) {
            if !pattern::check(buffer, page, 1, PATTERN_SEED, &mut scratch) {
                mismatches += 1;
            }
        }
    }
    mismatches
}

fn slabs_on(client: &Client, node: usize) -> usize {
    client.ranges().iter().flat_map(|range| &range.slabs).filter(|slab| slab.node == node).count()
}

#[test]
fn a_memory_hog_in_the_nodes_cgroup_makes_it_evict_and_the_client_rebuilds_every_page() {
    // The client's log (evictions heard, rebuilds placed and done) is shown if the test fails.
    let _ = tracing_subscriber::fmt().with_max_level(tracing::Level::INFO).with_test_writer().try_init();
    let name = format!("remem-monitor-test-{}", std::process::id());
    let cgroup = TestCgroup::create(&name, CGROUP_LIMIT_BYTES).unwrap_or_else(|error| {
        panic!("this test needs a writable memory cgroup (run as root on a host with cgroups): {error}")
    });
    let dir = std::env::temp_dir().join(format!("remem-monitor-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = LocalCluster::start(
        binary(),
        &ClusterOptions {
            lease_grace: None,
            nodes: 10,
            capacity_bytes: 16 * SLAB_BYTES,
            slab_size_bytes: SLAB_BYTES,
            nodes_per_domain: 1,
            dir: dir.clone(),
            fault_injection: false,
            monitor_args: None,
            unix_sockets: remem::launcher::UnixSockets::None,
            encrypt: false,
        },
    )
    .expect("cluster starts");

    // The eleventh node joins the cgroup before it execs, so all its memory is charged there.
    let log_path = dir.join("node-cgroup.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut node = KillOnDrop(
        Command::new("sh")
            .arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(cgroup.procs())
            .arg(binary())
            .args(["node", "--listen", "127.0.0.1:0", "--node-id", "11", "--failure-domain", "domain-cgroup"])
            .args(["--capacity", &(32 * SLAB_BYTES).to_string(), "--slab-size", &SLAB_BYTES.to_string()])
            .args(["--monitor-period", "150ms", "--headroom-percent", &HEADROOM_PERCENT.to_string()])
            .args(["--prealloc-slabs", "2", "--eviction-extra", "2"])
            .arg("--secret-file")
            .arg(&cluster.file.secret_file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("starting the cgroup node"),
    );
    let line = wait_for_line(&mut node.0, "listening ", Duration::from_secs(20));
    let node_address = line["listening ".len()..].trim().parse().expect("node address");
    let mut addresses = cluster.addresses();
    addresses.push(NodeAddress { address: node_address, unix_socket: None });
    let target = addresses.len() - 1;

    // Six ranges over eleven nodes: the cgroup node holds a slab of most of them.
    let pages = 6 * SLAB_BYTES / 512;
    let mut config = ClientConfig::new(EC82, pages * 4096);
    config.request_timeout = Duration::from_secs(2);
    let mut client = Client::connect(
        &addresses,
        &cluster.secret,
        config,
        Box::new(LeastLoaded::new(StdRng::seed_from_u64(7))),
    )
    .expect("client connects");
    write_all(&mut client, pages);
    let held_before = slabs_on(&client, target);
    assert!(held_before >= 3, "the cgroup node holds only {held_before} slabs");
    let mapped_before = node_slabs_mapped(&mut client, target);
    assert_eq!(mapped_before as usize, held_before);

    // The hog takes the group to 20 MiB below the headroom: the 8 MiB pool goes first, then
    // about three slabs. It stays well under the limit, so nothing is OOM-killed.
    let headroom_bytes = CGROUP_LIMIT_BYTES * HEADROOM_PERCENT / 100;
    let usage_bytes = cgroup.usage_bytes();
    let hog_bytes = (CGROUP_LIMIT_BYTES - headroom_bytes + 20 * MIB)
        .checked_sub(usage_bytes)
        .expect("the cgroup is already below its headroom before the hog");
    let mut hog = KillOnDrop(
        Command::new(binary())
            .args([
                "memory-hog",
                "--bytes",
                &hog_bytes.to_string(),
                "--step-bytes",
                "32MiB",
                "--hold",
                "120s",
            ])
            .arg("--join-cgroup")
            .arg(cgroup.procs())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the memory hog"),
    );
    wait_for_line(&mut hog.0, "held ", Duration::from_secs(30));

    // The node evicts within a few periods; the client hears of it and rebuilds.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        client.poll_background(Duration::from_millis(100));
        if node_slabs_mapped(&mut client, target) < mapped_before && slabs_on(&client, target) < held_before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cgroup node did not evict (usage {} of {CGROUP_LIMIT_BYTES}); see {}",
            cgroup.usage_bytes(),
            log_path.display()
        );
    }
    // The hog may still be growing when the first period acts, so more waves can follow: wait
    // until the node and the client agree and nothing is being rebuilt, a few periods apart.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(client.wait_for_regenerations(Duration::from_secs(60)), "rebuilds did not finish");
        client.poll_background(Duration::from_millis(500));
        // The node is asked first: eviction notices that arrive while the client waits for its
        // answer start rebuilds (and move slabs) then, so the client's state is read after it.
        let mapped = node_slabs_mapped(&mut client, target) as usize;
        let settled = client.regeneration_status().in_flight == 0 && mapped == slabs_on(&client, target);
        if settled {
            break;
        }
        assert!(Instant::now() < deadline, "evictions and rebuilds did not settle");
    }
    let held_after = slabs_on(&client, target);
    let evicted = held_before - held_after;
    assert_eq!(client.regeneration_status().done, evicted as u64, "every evicted slab was rebuilt once");
    assert!(client.ranges().iter().all(|range| range.unavailable == 0), "full redundancy restored");
    let mismatches = count_mismatches(&mut client, pages);
    eprintln!(
        "cgroup node held {held_before} slabs, evicted {evicted}, {} rebuilds, {pages} pages read, {mismatches} mismatches",
        client.regeneration_status().done
    );
    assert_eq!(mismatches, 0);

    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let source = format!("cgroup v{} {}", cgroup.version, cgroup.dir.display());
    assert!(log_text.contains(&source), "the node did not read {source}; see {}", log_path.display());
    assert!(log_text.contains("host below headroom"), "no eviction logged; see {}", log_path.display());
    drop(hog);
    drop(node);
    drop(client);
    drop(cluster);
    drop(cgroup);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `slabs_mapped` of node `node`, asked through the client's connection.
fn node_slabs_mapped(client: &mut Client, node: usize) -> u32 {
    let infos: HashMap<usize, u32> = client
        .node_infos()
        .into_iter()
        .enumerate()
        .filter_map(|(index, (_, info))| info.ok().map(|info| (index, info.slabs_mapped)))
        .collect();
    *infos.get(&node).expect("the cgroup node answers NodeInfo")
}
