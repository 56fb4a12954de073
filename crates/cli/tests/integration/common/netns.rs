//! Several hosts on one machine: network namespaces joined by a private switch, with links that
//! can be delayed, made lossy or cut.
//!
//! A [`Net`] is a "switch" namespace holding a Linux bridge and N "host" namespaces, each with
//! loopback up and one link to the bridge: `eth0` on the host, `pI` on the switch, the host at
//! `10.R.0.(I+1)/24`. R comes from the process id and a counter, and every namespace name carries
//! the process id, so concurrent test binaries never share a name or a subnet (and, each switch
//! being private, could not reach each other anyway).
//!
//! A link is a veth pair, impaired with `tc netem` on both ends. On a kernel without `sch_netem`
//! the hosts named impairable at creation get an emulated link instead: a tap device at each end
//! and two threads of this process per direction that carry the frames across, delayed, jittered
//! or dropped as told (a user-space netem). A partition takes both ends of the link down, for
//! either kind.
//!
//! Invariants: nothing is created or changed in the root namespace (every `ip` call names its
//! namespace, veth pairs are created inside the switch namespace with their peer moved straight
//! into the host). Processes are started only through [`Net::spawn`] from the thread that made the
//! net (they get SIGKILL if that thread dies, PR_SET_PDEATHSIG) and are killed by PID. Drop kills
//! every process it started, stops the emulated links, deletes every link and namespace, also
//! when the test panics. Namespaces that a killed earlier run of a test left behind (their
//! process id no longer runs) are deleted when a new net is made.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use rand::Rng;

/// Prefix of every namespace a net makes: `remem-netns-PID-N-sw`, `remem-netns-PID-N-hI`.
const PREFIX: &str = "remem-netns-";

/// Nets made by this process so far (namespace names and subnets differ per net).
static NETS_MADE: AtomicU32 = AtomicU32::new(0);

/// What a link does to the frames crossing it, in each direction.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Impairment {
    pub delay: Duration,
    /// Each frame's delay is `delay` plus a uniform draw in `-jitter..=jitter` (frames keep their
    /// order on an emulated link; netem may reorder).
    pub jitter: Duration,
    pub loss_percent: f64,
}

/// How a host's link is built.
enum Link {
    Veth,
    /// Tap devices at both ends and the threads that carry frames between them.
    Emulated(EmulatedLink),
}

/// One host namespace.
pub struct Host {
    pub namespace: String,
    pub address: Ipv4Addr,
    /// The link's end in the switch namespace.
    switch_port: String,
    link: Link,
}

/// A switch and its hosts; see the module documentation.
pub struct Net {
    pub switch: String,
    pub hosts: Vec<Host>,
    /// The kernel has `sch_netem` (checked once, on the first link).
    pub netem: bool,
    processes: Mutex<Vec<Child>>,
    owner: ThreadId,
}

/// Panics with the reason unless this process can make network namespaces (root, iproute2).
pub fn require_namespaces() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "the netns tests make network namespaces and must run as root (uid is {uid})");
    let output = Command::new("ip").args(["netns", "list"]).output();
    match output {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!("`ip netns list` failed: {}", String::from_utf8_lossy(&output.stderr)),
        Err(error) => panic!("cannot run `ip` ({error}): install iproute2 (scripts/setup.sh)"),
    }
}

/// Runs `ip ARGS` and panics with its stderr unless it succeeds.
fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("ip runs");
    assert!(output.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
}

/// Runs `ip ARGS`, ignoring failures (clean-up of what may already be gone).
fn ip_quietly(args: &[&str]) {
    let _ = Command::new("ip").args(args).stdout(Stdio::null()).stderr(Stdio::null()).status();
}

/// Deletes namespaces of earlier runs whose process no longer runs.
fn delete_stale_namespaces() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|pid| pid.parse::<u32>().ok()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            ip_quietly(&["netns", "del", &name]);
        }
    }
}

impl Net {
    /// Makes a switch and `host_count` hosts (at most 250). Hosts in `impairable` can be delayed
    /// and made lossy ([`Net::impair`]) also on a kernel without netem; any host can be
    /// partitioned. Panics with the reason if a namespace or link cannot be made.
    pub fn new(host_count: usize, impairable: &[usize]) -> Net {
        require_namespaces();
        assert!((1..=250).contains(&host_count), "1 to 250 hosts, not {host_count}");
        delete_stale_namespaces();
        let pid = std::process::id();
        let number = NETS_MADE.fetch_add(1, Ordering::Relaxed);
        let subnet = ((pid as u64 + u64::from(number) * 97) % 250 + 1) as u8;
        let base = format!("{PREFIX}{pid}-{number}");
        let mut net = Net {
            switch: format!("{base}-sw"),
            hosts: Vec::new(),
            netem: false,
            processes: Mutex::new(Vec::new()),
            owner: std::thread::current().id(),
        };
        ip(&["netns", "add", &net.switch]);
        ip(&["-n", &net.switch, "link", "set", "lo", "up"]);
        ip(&["-n", &net.switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &net.switch, "link", "set", "br0", "up"]);
        for index in 0..host_count {
            let namespace = format!("{base}-h{index}");
            let switch_port = format!("p{index}");
            let address = Ipv4Addr::new(10, subnet, 0, index as u8 + 1);
            ip(&["netns", "add", &namespace]);
            // Pushed before its link is made, so Drop deletes the namespace whatever fails next.
            net.hosts.push(Host { namespace: namespace.clone(), address, switch_port, link: Link::Veth });
            ip(&["-n", &namespace, "link", "set", "lo", "up"]);
            if index == 0 {
                net.netem = net.probe_netem(&namespace);
            }
            if impairable.contains(&index) && !net.netem {
                let link = EmulatedLink::new(&net.switch, &format!("p{index}"), &namespace);
                net.hosts[index].link = Link::Emulated(link);
            } else {
                ip(&[
                    "-n",
                    &net.switch,
                    "link",
                    "add",
                    &format!("p{index}"),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    &namespace,
                ]);
            }
            ip(&["-n", &net.switch, "link", "set", &format!("p{index}"), "master", "br0", "up"]);
            ip(&["-n", &namespace, "addr", "add", &format!("{address}/24"), "dev", "eth0"]);
            ip(&["-n", &namespace, "link", "set", "eth0", "up"]);
        }
        net
    }

    /// True when a netem qdisc can be put on a veth (made in `namespace` and deleted again).
    fn probe_netem(&self, namespace: &str) -> bool {
        ip(&["-n", namespace, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1"]);
        let output = Command::new("ip")
            .args([
                "netns", "exec", namespace, "tc", "qdisc", "add", "dev", "probe0", "root", "netem", "delay",
                "1ms",
            ])
            .output()
            .expect("ip runs");
        ip(&["-n", namespace, "link", "del", "probe0"]);
        output.status.success()
    }

    /// The address of host `host`.
    pub fn address(&self, host: usize) -> Ipv4Addr {
        self.hosts[host].address
    }

    /// Runs `program ARGS` in host `host` (through `ip netns exec`) under `timeout` seconds (then
    /// SIGTERM, SIGKILL 5 s later) and returns its output.
    pub fn run(&self, host: usize, seconds: u32, program: &str, args: &[&str]) -> Output {
        Command::new("timeout")
            .args([
                "-k",
                "5",
                &seconds.to_string(),
                "ip",
                "netns",
                "exec",
                &self.hosts[host].namespace,
                program,
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| panic!("cannot run {program} in host {host}: {error}"))
    }

    /// Starts `program ARGS` in host `host` (through `ip netns exec`, which execs it: the PID is
    /// the program's), stderr appended to `log`; returns its PID and its stdout. Only from the
    /// thread that made the net: the process dies with that thread (PR_SET_PDEATHSIG).
    pub fn spawn(&self, host: usize, program: &Path, args: &[String], log: &Path) -> (u32, ChildStdout) {
        assert_eq!(
            std::thread::current().id(),
            self.owner,
            "spawn from the thread that made the net: its processes die with that thread"
        );
        let log_file =
            std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file opens");
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.hosts[host].namespace]).arg(program).args(args);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and changes only the child; it
        // survives the exec of `ip` and of the program (neither is set-user-ID), so a test
        // killed before its Drop runs leaves no process behind.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {} in host {host}: {error}", program.display()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let pid = child.id();
        self.processes.lock().expect("no panic holds the lock").push(child);
        (pid, stdout)
    }

    /// Sends `signal` to `pid`, a process this net started and has not reaped; SIGKILL also
    /// reaps it. Panics for any other PID.
    pub fn signal(&self, pid: u32, signal: i32) {
        let mut processes = self.processes.lock().expect("no panic holds the lock");
        let position = processes
            .iter()
            .position(|child| child.id() == pid)
            .unwrap_or_else(|| panic!("pid {pid} was not started by this net, or is reaped"));
        // SAFETY: kill with the PID of a child we own and have not reaped, so it is not reused.
        let result = unsafe { libc::kill(pid as libc::pid_t, signal) };
        assert_eq!(result, 0, "kill({pid}, {signal}): {}", io::Error::last_os_error());
        if signal == libc::SIGKILL {
            let _ = processes.swap_remove(position).wait();
        }
    }

    /// The processes started by this net that have exited, with their status (reaped).
    pub fn exited(&self) -> Vec<(u32, std::process::ExitStatus)> {
        let mut processes = self.processes.lock().expect("no panic holds the lock");
        let mut exited = Vec::new();
        processes.retain_mut(|child| match child.try_wait() {
            Ok(Some(status)) => {
                exited.push((child.id(), status));
                false
            }
            _ => true,
        });
        exited
    }

    /// Moves the calling thread into host `host`'s network namespace: its sockets, and the
    /// threads and processes it starts afterwards, are on that host. Use it on a thread of its
    /// own ([`Net::run_in`]).
    pub fn enter(&self, host: usize) -> io::Result<()> {
        enter_namespace(&self.hosts[host].namespace)
    }

    /// Runs `work` on a new thread inside host `host` and returns what it returns (a panic in it
    /// is resumed on the caller).
    pub fn run_in<T: Send>(&self, host: usize, work: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|scope| {
            let thread = scope.spawn(|| {
                self.enter(host).unwrap_or_else(|error| panic!("entering host {host}: {error}"));
                work()
            });
            thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Delays, jitters or drops frames on host `host`'s link, both directions; a zero impairment
    /// clears it. With netem: `tc qdisc replace ... netem` on both ends of the veth. Without: only
    /// a host made impairable (emulated link).
    pub fn impair(&self, host: usize, impairment: Impairment) {
        let target = &self.hosts[host];
        match &target.link {
            Link::Emulated(link) => link.set(impairment),
            Link::Veth => {
                assert!(
                    self.netem,
                    "host {host}: this kernel has no sch_netem; make the host impairable in Net::new"
                );
                for (namespace, device) in
                    [(&target.namespace, "eth0"), (&self.switch, target.switch_port.as_str())]
                {
                    if impairment == Impairment::default() {
                        ip_quietly(&[
                            "netns", "exec", namespace, "tc", "qdisc", "del", "dev", device, "root",
                        ]);
                        continue;
                    }
                    let delay = format!("{}us", impairment.delay.as_micros());
                    let jitter = format!("{}us", impairment.jitter.as_micros());
                    let loss = format!("{}%", impairment.loss_percent);
                    let tc = ["tc", "qdisc", "replace", "dev", device, "root", "netem"];
                    let mut args = vec!["netns", "exec", namespace];
                    args.extend(tc);
                    args.extend(["delay", &delay, &jitter, "loss", &loss]);
                    ip(&args);
                }
            }
        }
    }

    /// Cuts host `host` off: both ends of its link down. Nothing it sends leaves, nothing sent
    /// to it arrives; its processes keep running.
    pub fn partition(&self, host: usize) {
        self.set_link(host, "down");
    }

    /// Undoes [`Net::partition`]: both ends up (the host's subnet route comes back with it).
    pub fn heal(&self, host: usize) {
        self.set_link(host, "up");
    }

    fn set_link(&self, host: usize, state: &str) {
        let target = &self.hosts[host];
        ip(&["-n", &target.namespace, "link", "set", "eth0", state]);
        ip(&["-n", &self.switch, "link", "set", &target.switch_port, state]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let processes =
            std::mem::take(&mut *self.processes.lock().unwrap_or_else(|poison| poison.into_inner()));
        for mut child in processes {
            let _ = child.kill();
            let _ = child.wait();
        }
        for host in &mut self.hosts {
            if let Link::Emulated(link) = &mut host.link {
                link.stop();
            }
            // Deleting one end of a veth deletes the pair; a tap went with its descriptor.
            ip_quietly(&["-n", &self.switch, "link", "del", &host.switch_port]);
            ip_quietly(&["netns", "del", &host.namespace]);
        }
        ip_quietly(&["-n", &self.switch, "link", "del", "br0"]);
        ip_quietly(&["netns", "del", &self.switch]);
    }
}

/// Moves the calling thread into the named network namespace.
fn enter_namespace(namespace: &str) -> io::Result<()> {
    let file = File::open(format!("/run/netns/{namespace}"))?;
    // SAFETY: setns with a descriptor we just opened on a namespace file; it changes only the
    // calling thread's network namespace.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads a process's first stdout line within `timeout` (empty if none came), then keeps
/// draining its stdout on a thread so it never blocks on a full pipe.
pub fn first_line(stdout: ChildStdout, timeout: Duration) -> String {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = sender.send(line);
        let _ = io::copy(&mut reader, &mut io::sink());
    });
    receiver.recv_timeout(timeout).unwrap_or_default()
}

/// `ioctl` request that names a tun/tap device (linux/if_tun.h).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;

/// `struct ifreq` as TUNSETIFF reads it: a name and the flags, in 40 bytes.
#[repr(C)]
struct InterfaceRequest {
    name: [u8; 16],
    flags: libc::c_short,
    _padding: [u8; 22],
}

/// Opens a tap device `name` in `namespace` (made on a thread that enters it: a tap belongs to
/// the namespace of the thread that creates it). It lives as long as the descriptor.
fn open_tap(namespace: &str, name: &str) -> io::Result<OwnedFd> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter_namespace(namespace)?;
                // SAFETY: open with a NUL-terminated path; the result is checked.
                let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: fd was just opened and is owned by nothing else.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                let mut request =
                    InterfaceRequest { name: [0; 16], flags: IFF_TAP | IFF_NO_PI, _padding: [0; 22] };
                assert!(name.len() < 16, "interface names are at most 15 bytes");
                request.name[..name.len()].copy_from_slice(name.as_bytes());
                // SAFETY: TUNSETIFF reads an ifreq; `request` has its layout and outlives the call.
                if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut request) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(fd)
            })
            .join()
            .expect("the tap thread does not panic")
    })
}

/// A link in user space: tap `eth0` in the host, tap `pI` in the switch, and per direction a
/// reader (drops or stamps each frame with its due time) and a writer (delivers it then).
struct EmulatedLink {
    impairment: Arc<Mutex<Impairment>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl EmulatedLink {
    fn new(switch: &str, switch_port: &str, host: &str) -> EmulatedLink {
        let at_switch = Arc::new(open_tap(switch, switch_port).expect("tap in the switch namespace"));
        let at_host = Arc::new(open_tap(host, "eth0").expect("tap in the host namespace"));
        let impairment = Arc::new(Mutex::new(Impairment::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (from, to) in [(&at_host, &at_switch), (&at_switch, &at_host)] {
            let (sender, receiver) = mpsc::channel::<(Instant, Vec<u8>)>();
            let (from, impairment, stop_reader) =
                (Arc::clone(from), Arc::clone(&impairment), Arc::clone(&stop));
            threads.push(std::thread::spawn(move || carry_in(&from, &impairment, &stop_reader, &sender)));
            let (to, stop_writer) = (Arc::clone(to), Arc::clone(&stop));
            threads.push(std::thread::spawn(move || carry_out(&to, &stop_writer, &receiver)));
        }
        EmulatedLink { impairment, stop, threads }
    }

    fn set(&self, impairment: Impairment) {
        *self.impairment.lock().expect("no panic holds the lock") = impairment;
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Reads frames from `from` until stopped; drops each with the loss probability, else hands it
/// to the writer with its due time (never before the previous frame's: the link keeps order).
fn carry_in(
    from: &OwnedFd,
    impairment: &Mutex<Impairment>,
    stop: &AtomicBool,
    sender: &mpsc::Sender<(Instant, Vec<u8>)>,
) {
    let mut rng = rand::thread_rng();
    let mut last_due = Instant::now();
    let mut buffer = vec![0u8; 65_536];
    let mut file = File::from(from.try_clone().expect("dup of the tap descriptor"));
    while !stop.load(Ordering::Relaxed) {
        let mut poll = libc::pollfd { fd: file.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        if unsafe { libc::poll(&mut poll, 1, 100) } <= 0 {
            continue;
        }
        let Ok(length) = file.read(&mut buffer) else { continue };
        let now = Instant::now();
        let Impairment { delay, jitter, loss_percent } = *impairment.lock().expect("no panic holds the lock");
        if loss_percent > 0.0 && rng.gen_range(0.0..100.0) < loss_percent {
            continue;
        }
        let jitter_ns = jitter.as_nanos() as i64;
        let offset_ns =
            delay.as_nanos() as i64 + if jitter_ns > 0 { rng.gen_range(-jitter_ns..=jitter_ns) } else { 0 };
        let due = (now + Duration::from_nanos(offset_ns.max(0) as u64)).max(last_due);
        last_due = due;
        if sender.send((due, buffer[..length].to_vec())).is_err() {
            return;
        }
    }
}

/// Writes each frame to `to` at its due time, until stopped. A write to a device that is down
/// fails: that frame is lost, as on a cable that is cut.
fn carry_out(to: &OwnedFd, stop: &AtomicBool, receiver: &mpsc::Receiver<(Instant, Vec<u8>)>) {
    let mut file = File::from(to.try_clone().expect("dup of the tap descriptor"));
    while !stop.load(Ordering::Relaxed) {
        let (due, frame) = match receiver.recv_timeout(Duration::from_millis(100)) {
            Ok(frame) => frame,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let _ = io::Write::write(&mut file, &frame);
    }
}

/// The arguments of a `remem node` on `host` listening on `address`: failure domain `host-H`,
/// no Resource Monitor (the hosts share one machine's memory).
pub fn node_args(
    address: SocketAddr,
    capacity: &str,
    slab_size: &str,
    host: usize,
    secret_file: &Path,
) -> Vec<String> {
    let address = address.to_string();
    let domain = format!("host-{host}");
    let secret = secret_file.to_string_lossy();
    let args = ["node", "--listen", &address, "--capacity", capacity, "--slab-size", slab_size];
    let more = ["--failure-domain", &domain, "--secret-file", &secret, "--no-monitor"];
    args.iter().chain(&more).map(|arg| arg.to_string()).collect()
}

/// Starts a node with `args` in `host` and waits for its "listening ADDRESS" line; its PID.
pub fn spawn_node(net: &Net, host: usize, address: SocketAddr, args: &[String], log: &Path) -> u32 {
    let (pid, stdout) = net.spawn(host, Path::new(env!("CARGO_BIN_EXE_remem")), args, log);
    let line = first_line(stdout, Duration::from_secs(20));
    assert_eq!(
        line.trim(),
        format!("listening {address}"),
        "a node in host {host} did not start; see {}",
        log.display()
    );
    pid
}

/// Starts etcd (one member) in host `host`, its data and log in `dir`, and waits until it is
/// healthy; its client URL.
pub fn start_etcd(net: &Net, host: usize, dir: &Path) -> String {
    let ip = net.address(host);
    let url = format!("http://{ip}:2379");
    let peer = format!("http://{ip}:2380");
    let data = dir.join("etcd-data").to_string_lossy().into_owned();
    let cluster = format!("mh={peer}");
    let args: Vec<String> = [
        "--name",
        "mh",
        "--data-dir",
        &data,
        "--listen-client-urls",
        &url,
        "--advertise-client-urls",
        &url,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &cluster,
    ]
    .map(str::to_owned)
    .to_vec();
    let _ = net.spawn(host, Path::new("etcd"), &args, &dir.join("etcd.log"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !net.run(host, 5, "etcdctl", &["--endpoints", &url, "endpoint", "health"]).status.success() {
        assert!(Instant::now() < deadline, "etcd did not start; see {}", dir.join("etcd.log").display());
        std::thread::sleep(Duration::from_millis(100));
    }
    url
}

/// The node keys registered in the etcd of host `etcd_host`, as etcdctl there lists them.
pub fn registered_keys(net: &Net, etcd_host: usize, url: &str) -> Vec<String> {
    let get = ["--endpoints", url, "get", "--prefix", "--keys-only", "/remem/nodes/"];
    let output = net.run(etcd_host, 10, "etcdctl", &get);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Starts a node on each port of `ports` in hosts `0..hosts`, of (capacity, slab size), with
/// `--etcd URL` and `extra` flags, logs in `dir`, and waits until all are registered in the
/// etcd of host `etcd_host`.
#[allow(clippy::too_many_arguments)]
pub fn start_etcd_nodes(
    net: &Net,
    (etcd_host, url): (usize, &str),
    hosts: usize,
    ports: &[u16],
    (capacity, slab_size): (&str, &str),
    secret: &Path,
    extra: &[&str],
    dir: &Path,
) {
    for host in 0..hosts {
        for &port in ports {
            let address = SocketAddr::from((net.address(host), port));
            let mut args = node_args(address, capacity, slab_size, host, secret);
            args.extend(["--etcd", url].iter().chain(extra).map(|arg| arg.to_string()));
            spawn_node(net, host, address, &args, &dir.join(format!("node-{host}-{port}.log")));
        }
    }
    let wanted = hosts * ports.len();
    let deadline = Instant::now() + Duration::from_secs(20);
    while registered_keys(net, etcd_host, url).len() != wanted {
        assert!(Instant::now() < deadline, "the nodes did not register; logs in {}", dir.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}
