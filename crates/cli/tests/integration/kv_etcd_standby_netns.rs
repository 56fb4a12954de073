//! Issue 27 item 3's bar, across "hosts" (network namespaces, common/netns.rs): etcd on its own
//! host, six node hosts registering there, `remem kv --etcd` on host A serving a service address
//! (on A's interface), `remem kv --etcd --standby` on host B, and a pymemcache writer on a client
//! host setting and deleting keys through the service address, recording every acknowledged
//! one. Every process of host A is SIGKILLed at once mid-run (A's kernel lives, so its
//! connections close at once; the address stays on A's interface, as a hung host's would). B's
//! standby takes the name when A's owner lease (2 s) lapses, serves, and its takeover command
//! adds the service address on B and announces it with a gratuitous ARP. From the client host,
//! the first successful reply through the service address comes within 5 s of the SIGKILL
//! (printed), and every acknowledged write is read back from B: 0 wrong, 0 lost. A second test
//! cuts A's link instead (a vanished host: the nodes hold its sessions until their lease
//! timeout), and A's kv, healed, is fenced.

use crate::common;
use crate::etcd_support::wait_for;
use crate::netns_support as netns;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use remem::kv_bench::TextClient;

const NODE_HOSTS: usize = 6;
const HOST_A: usize = NODE_HOSTS;
const HOST_B: usize = NODE_HOSTS + 1;
const CLIENT: usize = NODE_HOSTS + 2;
const ETCD_HOST: usize = NODE_HOSTS + 3;

/// The writer: sets (and every tenth op deletes) keys through the service address until the
/// server goes, writing `try OP KEY INDEX` before each request and `ack OP KEY INDEX` after
/// its acknowledgement (a line-buffered file: every acknowledged op is on disk before the next
/// request). Its values are `value_of(KEY, INDEX)`.
const WRITER: &str = r#"
import sys
from pymemcache.client.base import Client
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
client = Client((host, port), no_delay=True, connect_timeout=5, timeout=5)
sizes = [100, 1500, 3000, 5000, 20000]
with open(path, "w", buffering=1) as out:
    index = 0
    while True:
        key = "k%d" % (index % 300)
        op = "del" if index % 10 == 9 else "set"
        out.write("try %s %s %d\n" % (op, key, index))
        try:
            if op == "set":
                word = ("%s:%d:" % (key, index)).encode()
                size = sizes[index % len(sizes)]
                ok = client.set(key, (word * (size // len(word) + 1))[:size], noreply=False)
            else:
                client.delete(key, noreply=False)
                ok = True
        except Exception as error:
            out.write("error %r\n" % (error,))
            break
        if not ok:
            out.write("refused\n")
            break
        out.write("ack %s %s %d\n" % (op, key, index))
        index += 1
"#;

/// The writer's value of write `index` of `key`.
fn value_of(key: &str, index: u64) -> Vec<u8> {
    const SIZES: [usize; 5] = [100, 1500, 3000, 5000, 20_000];
    let size = SIZES[(index % 5) as usize];
    format!("{key}:{index}:").into_bytes().into_iter().cycle().take(size).collect()
}

/// What the writer's record says: per key its last acknowledged value (None: deleted), and the
/// op in flight at the kill (its key may hold the old or the new value).
struct Acknowledged {
    keys: HashMap<String, Option<Vec<u8>>>,
    in_flight: Option<(String, Option<Vec<u8>>)>,
    count: usize,
}

fn parse_record(text: &str) -> Acknowledged {
    let mut record = Acknowledged { keys: HashMap::new(), in_flight: None, count: 0 };
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        let [kind, op, key, index] = words[..] else { continue };
        let index: u64 = index.parse().expect("an index");
        let value = (op == "set").then(|| value_of(key, index));
        match kind {
            "try" => record.in_flight = Some((key.to_owned(), value)),
            "ack" => {
                record.keys.insert(key.to_owned(), value);
                record.in_flight = None;
                record.count += 1;
            }
            _ => {}
        }
    }
    record
}

/// utime + stime of `pid` in seconds, from /proc (the test and its hosts share a PID namespace).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("").split_whitespace().collect();
    let ticks: u64 =
        fields.get(11..13).map_or(0, |both| both.iter().filter_map(|text| text.parse::<u64>().ok()).sum());
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Whether `pid`, started by the net, has exited (a zombie, or reaped), without reaping it.
fn gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').is_none_or(|(_, rest)| rest.trim_start().starts_with('Z'))
}

/// The kv's arguments (a 2 s owner lease), listening on the service address. The paths are the
/// test's scratch directory's, without spaces.
fn kv_args(url: &str, secret: &Path, state: &Path, service: SocketAddr) -> Vec<String> {
    let line = format!(
        "kv --etcd {url} --export cache -m 16MiB -k 4 -r 2 --backup-size 4MiB --etcd-lease-seconds 2 \
         --request-timeout-ms 1000 --listen {service} --secret-file {} --state {}",
        secret.display(),
        state.display()
    );
    line.split_whitespace().map(str::to_owned).collect()
}

/// Etcd and six node hosts of one node each (with `node_flags`), registered. Returns etcd's URL.
fn start_cluster(net: &netns::Net, dir: &Path, secret: &Path, node_flags: &[&str]) -> String {
    let url = netns::start_etcd(net, ETCD_HOST, dir);
    netns::start_etcd_nodes(
        net,
        (ETCD_HOST, &url),
        NODE_HOSTS,
        &[7100],
        ("16MiB", "1MiB"),
        secret,
        node_flags,
        dir,
    );
    url
}

/// The hosts, the primary on A serving the service address, its standby on B standing by, and
/// the writer on the client host with `writes` acknowledged.
struct Pair {
    net: netns::Net,
    dir: common::ScratchDir,
    url: String,
    service: SocketAddr,
    primary: u32,
    standby: u32,
    standby_stdout: std::process::ChildStdout,
    writer: u32,
    record_path: PathBuf,
    /// The standby's CPU seconds, and the seconds and primary writes they were measured over.
    standing_by: (f64, f64, usize),
}

impl Pair {
    fn set_up(name: &str, node_flags: &[&str], writes: usize) -> Pair {
        netns::require_namespaces();
        let pymemcache =
            std::process::Command::new("/usr/bin/python3").args(["-c", "import pymemcache"]).output();
        assert!(
            pymemcache.is_ok_and(|output| output.status.success()),
            "python3-pymemcache (scripts/setup.sh)"
        );
        let net = netns::Net::new(NODE_HOSTS + 4, &[]);
        let dir = common::ScratchDir::new(name);
        let secret = crate::etcd_support::write_secret(&dir);
        let url = start_cluster(&net, &dir, &secret, node_flags);
        let [a, b, c, _] = net.address(0).octets();
        let service_ip = Ipv4Addr::new(a, b, c, 200);
        let service = SocketAddr::from((service_ip, 11211));
        // The service address starts on A; B may bind it before it holds it (its takeover
        // command adds it after B serves).
        let added = std::process::Command::new("ip")
            .args([
                "-n",
                &net.hosts[HOST_A].namespace,
                "addr",
                "add",
                &format!("{service_ip}/32"),
                "dev",
                "eth0",
            ])
            .status();
        assert!(added.is_ok_and(|status| status.success()), "the service address on A");
        let sysctl = net.run(HOST_B, 10, "sysctl", &["-w", "net.ipv4.ip_nonlocal_bind=1"]);
        assert!(sysctl.status.success(), "{}", String::from_utf8_lossy(&sysctl.stderr));

        let binary = Path::new(env!("CARGO_BIN_EXE_remem"));
        let (primary, stdout) =
            net.spawn(HOST_A, binary, &kv_args(&url, &secret, &dir.join("a"), service), &dir.join("a.log"));
        let line = netns::first_line(stdout, Duration::from_secs(40));
        let log = || std::fs::read_to_string(dir.join("a.log")).unwrap_or_default();
        assert_eq!(line.trim(), format!("listening {service}"), "{}", log());
        let takeover =
            format!("ip addr replace {service_ip}/32 dev eth0 && arping -q -U -c 2 -I eth0 {service_ip}");
        let mut args = kv_args(&url, &secret, &dir.join("b"), service);
        args.extend(["--standby".to_owned(), "--takeover-command".to_owned(), takeover]);
        let (standby, standby_stdout) = net.spawn(HOST_B, binary, &args, &dir.join("b.log"));
        let standby_log = || std::fs::read_to_string(dir.join("b.log")).unwrap_or_default();
        assert!(
            wait_for(Duration::from_secs(20), || standby_log().contains("standing by")),
            "{}",
            standby_log()
        );

        let record_path = dir.join("writer.record");
        let record = record_path.to_string_lossy().into_owned();
        let writer_args = ["-c", WRITER, &service_ip.to_string(), "11211", &record].map(str::to_owned);
        let (writer, _) =
            net.spawn(CLIENT, Path::new("/usr/bin/python3"), &writer_args, &dir.join("writer.log"));
        let (cpu, writing) = (cpu_seconds(standby), Instant::now());
        let acknowledged = || parse_record(&std::fs::read_to_string(&record_path).unwrap_or_default()).count;
        assert!(
            wait_for(Duration::from_secs(90), || acknowledged() >= writes),
            "the writer: {}",
            acknowledged()
        );
        let standing_by = (cpu_seconds(standby) - cpu, writing.elapsed().as_secs_f64(), acknowledged());
        Pair { net, dir, url, service, primary, standby, standby_stdout, writer, record_path, standing_by }
    }

    fn standby_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("b.log")).unwrap_or_default()
    }

    /// The time from `since` to the first reply through the service address, from the client
    /// host (a new connection every 20 ms; at most 30 s).
    fn first_reply(&self, since: Instant) -> Duration {
        self.net.run_in(CLIENT, || loop {
            assert!(since.elapsed() < Duration::from_secs(30), "no reply through the service address");
            if let Ok(mut client) = TextClient::connect(self.service, Duration::from_millis(500)) {
                if client.get("probe").is_ok() {
                    return since.elapsed();
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        })
    }

    /// Once the writer stopped: every acknowledged write read back through the service address,
    /// (as acknowledged, lost, wrong), and the count of acknowledged writes.
    fn check_acknowledged(&self) -> (usize, usize, usize, usize) {
        let stopped = wait_for(Duration::from_secs(15), || gone(self.writer));
        assert!(stopped, "the writer stops when its server goes");
        let record = parse_record(&std::fs::read_to_string(&self.record_path).expect("the writer's record"));
        let (good, lost, wrong) = self.net.run_in(CLIENT, || {
            let mut client =
                TextClient::connect(self.service, Duration::from_secs(10)).expect("connects to B");
            let (mut good, mut lost, mut wrong) = (0, 0, 0);
            for (key, expected) in &record.keys {
                let read = client.get(key).unwrap_or_else(|error| panic!("get {key}: {error:?}"));
                let in_flight =
                    record.in_flight.as_ref().filter(|(flying, _)| flying == key).map(|(_, value)| value);
                match (read == *expected || in_flight == Some(&read), &read, expected) {
                    (true, ..) => good += 1,
                    (false, None, Some(_)) => lost += 1,
                    (false, ..) => wrong += 1,
                }
            }
            (good, lost, wrong)
        });
        (good, lost, wrong, record.count)
    }

    /// The endpoint record in etcd.
    fn endpoint(&self) -> String {
        let get = ["--endpoints", &self.url, "get", "--print-value-only", "/remem/clients/cache/endpoint"];
        String::from_utf8_lossy(&self.net.run(ETCD_HOST, 10, "etcdctl", &get).stdout).into_owned()
    }
}

#[test]
fn kv_etcd_standby_on_another_host_serves_every_acknowledged_write_within_5_s_of_host_a_killed() {
    let pair = Pair::set_up("kv-etcd-standby-netns", &[], 4000);
    pair.net.signal(pair.primary, libc::SIGKILL); // every process of host A (and reaped)
    let failover = pair.first_reply(Instant::now());
    let Pair { standby, standing_by: (cpu, seconds, writes), .. } = pair;
    eprintln!(
        "failover: the first reply through {} came {} ms after host A's SIGKILL\n{}",
        pair.service,
        failover.as_millis(),
        pair.standby_log()
    );
    eprintln!(
        "standing by, the standby took {cpu:.2} CPU s in {seconds:.1} s of {writes} primary writes ({:.1} s per \
         million writes, {:.1} ms per second: it reads the owner key, whatever the writes)",
        cpu / writes as f64 * 1e6,
        cpu / seconds * 1e3
    );
    let (good, lost, wrong, count) = pair.check_acknowledged();
    eprintln!("{count} acknowledged writes, {good} keys as acknowledged, {lost} lost, {wrong} wrong");
    assert_eq!((lost, wrong), (0, 0));
    assert!(failover < Duration::from_secs(5), "failover took {failover:?}");
    let endpoint = pair.endpoint();
    assert!(
        endpoint.contains(&pair.service.to_string()) && endpoint.contains(&format!("\"pid\":{standby}")),
        "{endpoint}"
    );
    let listening = netns::first_line(pair.standby_stdout, Duration::from_secs(5));
    assert_eq!(listening.trim(), format!("listening {}", pair.service));
}

/// Host A vanishes (its link cut: its connections stay open on the nodes, nothing it sends
/// arrives). Its owner lease lapses after 2 s, but the nodes refuse B's session of the kv's
/// client id until their `--lease-timeout` (7 s here, longer than a reopen's own 3 s of retries)
/// closes A's silent connections: B gives the name back and claims it again until they let it
/// in, then serves every acknowledged write. Healed, A's kv finds the name taken (fenced) and
/// stops.
#[test]
fn kv_etcd_standby_takes_over_from_a_vanished_host_after_the_nodes_lease_timeout() {
    let pair = Pair::set_up("kv-etcd-standby-vanished", &["--lease-timeout", "7s"], 1000);
    pair.net.partition(HOST_A);
    let failover = pair.first_reply(Instant::now());
    eprintln!(
        "failover: the first reply came {} ms after host A vanished\n{}",
        failover.as_millis(),
        pair.standby_log()
    );
    let (good, lost, wrong, count) = pair.check_acknowledged();
    eprintln!("{count} acknowledged writes, {good} keys as acknowledged, {lost} lost, {wrong} wrong");
    assert_eq!((lost, wrong), (0, 0));
    assert!(pair.standby_log().contains("the nodes still hold the old primary's session"), "retried");
    assert!(pair.standby_log().contains(&format!("from pid {}", pair.primary)), "names the primary");
    assert!(
        failover > Duration::from_secs(7) && failover < Duration::from_secs(20),
        "failover took {failover:?}"
    );
    pair.net.heal(HOST_A);
    let a_log = || std::fs::read_to_string(pair.dir.join("a.log")).unwrap_or_default();
    let stopped = wait_for(Duration::from_secs(30), || gone(pair.primary));
    assert!(stopped, "A's kv serves on after B took over: {}", a_log());
    eprintln!(
        "host A's kv, healed, stopped:\n{}",
        a_log().lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
}
