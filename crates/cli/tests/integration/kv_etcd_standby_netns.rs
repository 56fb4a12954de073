//! Issue 27 item 3's bar, across "hosts" (network namespaces, common/netns.rs): etcd on its own
//! host, six node hosts registering there, `remem kv --etcd` on host A serving a service address
//! (on A's interface), `remem kv --etcd --standby` on host B, and a pymemcache writer on a client
//! host setting and deleting keys through the service address, recording every acknowledged
//! one. Every process of host A is SIGKILLed at once mid-run (A's kernel lives, so its
//! connections close at once; the address stays on A's interface, as a hung host's would). B's
//! standby takes the name when A's owner lease (2 s) lapses, serves, and its takeover command
//! adds the service address on B and announces it with a gratuitous ARP. From the client host,
//! the first successful reply through the service address comes within 5 s of the SIGKILL
//! (printed), and every acknowledged write is read back from B: 0 wrong, 0 lost.

use crate::common;
use crate::etcd_support::wait_for;
use crate::netns_support as netns;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
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

/// Etcd and six node hosts of one node each, registered. Returns etcd's URL.
fn start_cluster(net: &netns::Net, dir: &Path, secret: &Path) -> String {
    let url = netns::start_etcd(net, ETCD_HOST, dir);
    for host in 0..NODE_HOSTS {
        let address = SocketAddr::from((net.address(host), 7100));
        let mut args = netns::node_args(address, "16MiB", "1MiB", host, secret);
        args.extend(["--etcd".to_owned(), url.clone()]);
        netns::spawn_node(net, host, address, &args, &dir.join(format!("node-{host}.log")));
    }
    let registered = wait_for(Duration::from_secs(20), || {
        let get = ["--endpoints", &url, "get", "--prefix", "--keys-only", "/remem/nodes/"];
        let output = net.run(ETCD_HOST, 10, "etcdctl", &get);
        String::from_utf8_lossy(&output.stdout).lines().filter(|line| !line.is_empty()).count() == NODE_HOSTS
    });
    assert!(registered, "the nodes did not register");
    url
}

#[test]
fn kv_etcd_standby_on_another_host_serves_every_acknowledged_write_within_5_s_of_host_a_killed() {
    netns::require_namespaces();
    let pymemcache =
        std::process::Command::new("/usr/bin/python3").args(["-c", "import pymemcache"]).output();
    assert!(pymemcache.is_ok_and(|output| output.status.success()), "python3-pymemcache (scripts/setup.sh)");
    let net = netns::Net::new(NODE_HOSTS + 4, &[]);
    let dir = common::ScratchDir::new("kv-etcd-standby-netns");
    let secret = crate::etcd_support::write_secret(&dir);
    let url = start_cluster(&net, &dir, &secret);
    let [a, b, c, _] = net.address(0).octets();
    let service_ip = Ipv4Addr::new(a, b, c, 200);
    let service = SocketAddr::from((service_ip, 11211));
    let namespace = |host: usize| net.hosts[host].namespace.clone();
    let ip = |host: usize, args: &[&str]| {
        let output =
            std::process::Command::new("ip").arg("-n").arg(namespace(host)).args(args).output().expect("ip");
        assert!(output.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    };
    // The service address starts on A; B may bind it before it holds it (its takeover command
    // adds it after B serves).
    ip(HOST_A, &["addr", "add", &format!("{service_ip}/32"), "dev", "eth0"]);
    let sysctl = net.run(HOST_B, 10, "sysctl", &["-w", "net.ipv4.ip_nonlocal_bind=1"]);
    assert!(sysctl.status.success(), "{}", String::from_utf8_lossy(&sysctl.stderr));

    let binary = Path::new(env!("CARGO_BIN_EXE_remem"));
    let (primary, stdout) =
        net.spawn(HOST_A, binary, &kv_args(&url, &secret, &dir.join("a"), service), &dir.join("a.log"));
    let line = netns::first_line(stdout, Duration::from_secs(40));
    assert_eq!(
        line.trim(),
        format!("listening {service}"),
        "{}",
        std::fs::read_to_string(dir.join("a.log")).unwrap_or_default()
    );
    let takeover = format!("ip addr add {service_ip}/32 dev eth0 && arping -q -U -c 2 -I eth0 {service_ip}");
    let mut args = kv_args(&url, &secret, &dir.join("b"), service);
    args.extend(["--standby".to_owned(), "--takeover-command".to_owned(), takeover]);
    let (standby, standby_stdout) = net.spawn(HOST_B, binary, &args, &dir.join("b.log"));
    let standby_log = || std::fs::read_to_string(dir.join("b.log")).unwrap_or_default();
    assert!(wait_for(Duration::from_secs(20), || standby_log().contains("standing by")), "{}", standby_log());

    let record_path = dir.join("writer.record");
    let writer_args: Vec<String> =
        ["-c", WRITER, &service_ip.to_string(), "11211", &record_path.to_string_lossy()]
            .map(str::to_owned)
            .to_vec();
    let (writer, _) = net.spawn(CLIENT, Path::new("/usr/bin/python3"), &writer_args, &dir.join("writer.log"));
    let (standby_cpu, writing) = (cpu_seconds(standby), Instant::now());
    let acknowledged = || parse_record(&std::fs::read_to_string(&record_path).unwrap_or_default()).count;
    assert!(wait_for(Duration::from_secs(90), || acknowledged() >= 4000), "the writer: {}", acknowledged());
    let writes_before_kill = acknowledged();
    let (standby_cpu, writing) = (cpu_seconds(standby) - standby_cpu, writing.elapsed());

    net.signal(primary, libc::SIGKILL); // every process of host A (and reaped)
    let killed = Instant::now();
    let failover = net.run_in(CLIENT, || loop {
        assert!(killed.elapsed() < Duration::from_secs(30), "no reply through the service address");
        if let Ok(mut client) = TextClient::connect(service, Duration::from_millis(500)) {
            if client.get("probe").is_ok() {
                return killed.elapsed();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    });
    let listening = netns::first_line(standby_stdout, Duration::from_secs(5));
    eprintln!(
        "failover: the first reply through {service} came {} ms after host A's SIGKILL ({})\n{}",
        failover.as_millis(),
        listening.trim(),
        standby_log()
    );
    assert!(
        wait_for(Duration::from_secs(10), || net.exited().iter().any(|(pid, _)| *pid == writer)),
        "the writer stops"
    );
    let record = parse_record(&std::fs::read_to_string(&record_path).expect("the writer's record"));
    eprintln!(
        "standing by, the standby took {standby_cpu:.2} CPU s in {:.1} s of {writes_before_kill} primary writes ({:.1} s \
         per million writes, {:.1} ms per second: it reads the owner key, whatever the writes)",
        writing.as_secs_f64(),
        standby_cpu / writes_before_kill as f64 * 1e6,
        standby_cpu / writing.as_secs_f64() * 1e3
    );
    let (good, lost, wrong) = net.run_in(CLIENT, || {
        let mut client = TextClient::connect(service, Duration::from_secs(10)).expect("connects to B");
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
    eprintln!(
        "{} acknowledged writes, {good} keys as acknowledged, {lost} lost, {wrong} wrong",
        record.count
    );
    assert_eq!((lost, wrong), (0, 0));
    assert!(failover < Duration::from_secs(5), "failover took {failover:?}");
    let endpoint = net.run(
        ETCD_HOST,
        10,
        "etcdctl",
        &["--endpoints", &url, "get", "--print-value-only", "/remem/clients/cache/endpoint"],
    );
    let endpoint = String::from_utf8_lossy(&endpoint.stdout);
    assert!(
        endpoint.contains(&service.to_string()) && endpoint.contains(&format!("\"pid\":{standby}")),
        "{endpoint}"
    );
}
