//! A memory node SIGKILLed in the middle of a run: an application arms the timer when its
//! measured phase starts, and the node dies `delay` later unless the phase ended first.

use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Which node to kill (a process of the cluster the bench started, not yet reaped, so its PID
/// cannot have been reused) and how long after the measured phase starts.
#[derive(Clone, Copy, Debug)]
pub struct Failure {
    pub pid: u32,
    pub delay: Duration,
}

/// Kills the node when its delay passes; dropping it before then cancels the kill.
pub struct KillTimer {
    cancel: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Option<Duration>>>,
}

impl KillTimer {
    pub fn arm(failure: Option<Failure>) -> KillTimer {
        let Some(failure) = failure else { return KillTimer { cancel: None, thread: None } };
        let (cancel, cancelled) = mpsc::channel::<()>();
        let started = Instant::now();
        let thread = std::thread::spawn(move || match cancelled.recv_timeout(failure.delay) {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // SAFETY: kill with the PID of a node process the bench's cluster spawned and
                // has not reaped (see `Failure`).
                unsafe { libc::kill(failure.pid as libc::pid_t, libc::SIGKILL) };
                eprintln!(
                    "bench apps: SIGKILLed memory node pid {} after {:.1} s",
                    failure.pid,
                    started.elapsed().as_secs_f64()
                );
                Some(started.elapsed())
            }
            _ => None,
        });
        KillTimer { cancel: Some(cancel), thread: Some(thread) }
    }

    /// Ends the timer: when the node was killed, how long after arming.
    pub fn finish(mut self) -> Option<Duration> {
        self.stop()
    }

    fn stop(&mut self) -> Option<Duration> {
        drop(self.cancel.take());
        self.thread.take().and_then(|thread| thread.join().ok().flatten())
    }
}

impl Drop for KillTimer {
    fn drop(&mut self) {
        self.stop();
    }
}
