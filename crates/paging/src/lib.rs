//! remem-paging: paging inside a process (`remem run --paging uffd`). A preloaded library
//! (crates/preload) starts one handler thread that registers the process's large private
//! anonymous memory with userfaultfd and serves its faults from remem, keeping the pages within
//! a local budget; see docs/PAGING.md.
//!
//! - [`uffd`]: the userfaultfd ioctls (move and poison included).
//! - [`maps`]: which mappings are managed.
//! - [`pages`]: where each page is and which to evict (no I/O).
//! - [`pager`]: the handler thread: faults, events, eviction, write-back through the client.
//! - [`arena`]: the pager's own allocator, so the handler never touches managed memory or the
//!   program's malloc.
//!
//! Architecture Invariant: the handler never reads or writes a managed page with a load or a
//! store (pages leave and come back by UFFDIO_MOVE and UFFDIO_COPY), and never waits on a
//! thread of the program; the program's threads never take a lock of the pager.

pub mod arena;
mod buffer;
pub mod config;
pub mod maps;
pub mod pager;
pub mod pages;
pub mod stats;
pub mod uffd;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use remem_client::cluster::ClusterFile;
use remem_client::{Client, ClientConfig, Secret, Shape};

use crate::config::Config;
use crate::pager::{Pager, Setup};

/// How the program's threads ask the handler for something (around a fork): an eventfd to wake
/// it and an atomic word for the request and its answer.
pub struct Control {
    fd: AtomicU32,
    state: AtomicU32,
    /// False in a forked child (no handler there) and before the pager started.
    active: AtomicBool,
}

const IDLE: u32 = 0;
const BRING_HOME: u32 = 1;
const PAUSED: u32 = 2;
const RESUME: u32 = 3;
const SAVE: u32 = 4;
const SAVED: u32 = 5;

pub static CONTROL: Control =
    Control { fd: AtomicU32::new(u32::MAX), state: AtomicU32::new(IDLE), active: AtomicBool::new(false) };

impl Control {
    pub fn fd(&self) -> i32 {
        self.fd.load(Ordering::Relaxed) as i32
    }

    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to the eventfd (async-signal-safe).
        unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
    }

    /// Handler side: acts on a request.
    pub fn serve(&self, pager: &mut Pager) {
        match self.state.load(Ordering::Acquire) {
            BRING_HOME => {
                let mut drained: u64 = 0;
                // SAFETY: reads the eventfd's 8-byte counter into a valid u64.
                unsafe { libc::read(self.fd(), (&mut drained as *mut u64).cast(), 8) };
                pager.bring_home();
                self.state.store(PAUSED, Ordering::Release);
            }
            RESUME => {
                let mut drained: u64 = 0;
                // SAFETY: as above.
                unsafe { libc::read(self.fd(), (&mut drained as *mut u64).cast(), 8) };
                self.state.store(IDLE, Ordering::Release);
                pager.resume();
            }
            SAVE => {
                pager.save_map();
                self.state.store(SAVED, Ordering::Release);
            }
            _ => {}
        }
    }

    /// At exit: the pager saves its slab map (rebuilds may have moved slabs since it
    /// connected), for `remem run` to give the slabs back. Bounded at 5 s.
    fn save(&self) {
        self.state.store(SAVE, Ordering::Release);
        self.signal();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.state.load(Ordering::Acquire) != SAVED && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Before fork (a thread of the program): every page home, eviction paused. Bounded: a
    /// handler that does not answer in 30 s is not waited for.
    pub fn before_fork(&self) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        self.state.store(BRING_HOME, Ordering::Release);
        self.signal();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.state.load(Ordering::Acquire) != PAUSED && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    pub fn after_fork_in_parent(&self) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        self.state.store(RESUME, Ordering::Release);
        self.signal();
    }

    /// The child has no handler: its memory is all home and registered with nothing.
    pub fn after_fork_in_child(&self) {
        self.active.store(false, Ordering::Release);
    }
}

extern "C" fn before_fork() {
    CONTROL.before_fork();
}
extern "C" fn after_fork_in_parent() {
    CONTROL.after_fork_in_parent();
}
extern "C" fn after_fork_in_child() {
    CONTROL.after_fork_in_child();
}

/// Starts paging this process when the environment says so (the preload library's
/// constructor). Waits until the pager serves faults; on an error, says why and exits with
/// status 1: a program asked to run within a budget does not silently run without one.
pub fn start() {
    let config = match Config::from_env() {
        Ok(Some(config)) => config,
        Ok(None) => return,
        Err(error) => fail(&error),
    };
    // SAFETY: eventfd takes flags only and returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        fail(&format!("eventfd: {}", std::io::Error::last_os_error()));
    }
    CONTROL.fd.store(fd as u32, Ordering::Relaxed);
    let (ready, started) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("remem-pager".into())
        .stack_size(1 << 20)
        .spawn(move || handler(config, ready));
    if let Err(error) = spawned {
        fail(&format!("starting the handler thread: {error}"));
    }
    match started.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(())) => {}
        Ok(Err(error)) => fail(&error),
        Err(_) => fail("the handler did not start within 60 s"),
    }
    CONTROL.active.store(true, Ordering::Release);
    // SAFETY: registers three extern "C" functions that live as long as the process.
    unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child)) };
}

fn fail(error: &str) -> ! {
    eprintln!("remem paging: {error}");
    std::process::exit(1);
}

/// At exit (the library's destructor): writes the pager's counters where
/// `REMEM_PAGING_STATS` says and saves the slab map. The pager serves faults to the end
/// (stdio flushes its buffers after every destructor).
pub fn finish() {
    if !CONTROL.active.load(Ordering::Acquire) {
        return;
    }
    if let Some(path) = std::env::var_os(config::STATS) {
        let _ = std::fs::write(path, stats::STATS.json() + "\n");
    }
    CONTROL.save();
}

fn handler(config: Config, ready: std::sync::mpsc::Sender<Result<(), String>>) {
    let marker = 0u8;
    let stack = &marker as *const u8 as u64;
    match connect(&config, stack, thread_vector()) {
        Ok(mut pager) => {
            if let Err(error) = pager.connect() {
                let _ = ready.send(Err(error));
                return;
            }
            pager.scan();
            let _ = ready.send(Ok(()));
            pager.run(&CONTROL)
        }
        Err(error) => {
            let _ = ready.send(Err(error));
        }
    }
}

/// This thread's dynamic thread vector (glibc's DTV, which every access to a thread-local
/// reads): glibc allocated it with the program's malloc when it created the thread, so it lies in
/// managed memory, and the pager must never evict its pages.
#[cfg(target_arch = "x86_64")]
pub fn thread_vector() -> Option<(u64, u64)> {
    let vector: u64;
    // SAFETY: on x86-64 glibc, %fs points at the thread's tcbhead_t, whose second word is the
    // DTV; reading it has no side effect.
    unsafe { std::arch::asm!("mov {}, qword ptr fs:[8]", out(reg) vector, options(nostack, readonly)) };
    if vector < 16 {
        return None;
    }
    // SAFETY: glibc keeps the DTV's length in the 16-byte entry before it (dtv[-1].counter).
    let length = unsafe { *((vector - 16) as *const u64) };
    Some((vector - 16, vector + (length.min(1 << 20) + 1) * 16))
}

#[cfg(not(target_arch = "x86_64"))]
pub fn thread_vector() -> Option<(u64, u64)> {
    None
}

fn connect(config: &Config, stack: u64, thread_vector: Option<(u64, u64)>) -> Result<Pager, String> {
    let arena = arena::Arena::range().ok_or("cannot reserve the pager's memory")?;
    let cluster = ClusterFile::load(&config.cluster).map_err(|error| error.to_string())?;
    let secret = Secret::load(Some(&cluster.secret_file)).map_err(|error| error.to_string())?;
    let shape = Shape {
        data_splits: config.data_splits,
        parity_splits: config.parity_splits,
        extra_reads: config.parity_splits.min(1),
    };
    let mut client_config = ClientConfig::new(shape, config.remote_bytes);
    client_config.shared_memory = config.shared_memory;
    client_config.encrypt = config.encrypt;
    client_config.spin_before_block = config.spin;
    // The handler thread must never start a thread once pages are managed (see the field).
    client_config.probe_thread_at_start = true;
    let path = config.cluster.clone();
    let map_path = config.map.clone();
    let connect = move || {
        // Only the command is paged and exec keeps its PID, so a saved map at start is an
        // earlier image's of this same process (a wrapper that execs the program, as a pyenv
        // shim or `sh -c` does): its pager ended without a destructor. Give its slabs back
        // first, or each image of the chain would hold a region until the lease grace ends.
        if let Some(saved) = map_path.as_deref().and_then(|map| remem_client::SlabMapFile::load(map).ok()) {
            let _ = Client::release_saved(&saved, &secret, client_config.clone());
        }
        let placement =
            remem_placement::Policy::parse("codingsets-p2c").expect("a policy name").build(rand::random(), 2);
        Client::connect(&cluster.addresses(), &secret, client_config.clone(), placement)
            .map_err(|error| format!("connecting to the cluster of {}: {error}", path.display()))
    };
    // The handler's own stack is never managed (it would fault on itself).
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|error| error.to_string())?;
    let stack_mapping =
        maps::all_mappings(&maps).into_iter().find(|&(start, end)| start <= stack && stack < end);
    let mut excluded = vec![arena];
    excluded.extend(stack_mapping);
    Pager::new(Setup {
        connect: Box::new(connect),
        limit_bytes: config.limit_bytes,
        remote_pages: (config.remote_bytes / pager::PAGE).min(u32::MAX as u64 - 1) as u32,
        min_bytes: config.min_bytes,
        protected_percent: config.protected_percent,
        spin: config.spin,
        excluded,
        pinned: thread_vector.into_iter().collect(),
        map_path: config.map.clone(),
        write_back_batch: if config.shared_memory { 8 } else { 32 },
    })
    .map_err(|error| format!("userfaultfd: {error} (paging inside a process needs root or CAP_SYS_PTRACE)"))
}
