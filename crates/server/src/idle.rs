//! A core kept awake between requests (`--poll-idle-us`). A runtime thread that runs out of work parks in
//! `epoll_wait`, and the next request wakes it on a core that has gone idle: on the virtual machines inferd is
//! measured on, whatever runs first after such a sleep runs slowly (ONNX Runtime's run of a digits row, called from
//! Python, took 10 µs back to back and 30 µs after any sleep from 20 µs to 1 ms, but 10 µs after 100 µs of spinning;
//! benches/README.md). So, for up to the set time from the first park after a request's work ends (its answer then
//! written), a runtime thread about to park first polls the server's listeners and connections, without sleeping,
//! and parks once one of them has something to read (the runtime then finds it without a sleep), a task is queued
//! for the runtime from a thread outside it (the blocking pool's, a batch worker's), a request's work starts, or the
//! time is up. A request's work is its time in a batcher and on the blocking pool; one thread polls at a time, none
//! while work is under way, nor for [`OVERLAP_PAUSE`] after two requests' work overlapped, so under load the cores
//! stay with the work and the clients; a wake-up with no work ended since the last poll (a timer's) polls nothing.
//! While a thread polls and no other waits in the runtime's `epoll_wait`, the runtime's timers and signals, and
//! tasks another worker queues for itself, wait for the poll to end (at most [`MAX_POLL_US`]).
//!
//! The sockets are watched through an epoll set of this module's own, level-triggered ([`watch`] on each listener
//! and accepted connection; a closed one leaves it by itself). The runtime's hook is [`before_park`]; the `inferd`
//! binary installs it and turns polling on with [`enable`]. Where it is off (the runtimes of tests and embedders,
//! `--poll-idle-us 0`) the hook returns at once and nothing is watched.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use rustix::event::epoll;

/// How long after two requests' work last overlapped no thread polls: polling is for a lone client's
/// stream of requests, and where requests overlap the cores have work enough (polling there took CPU from the
/// batches and the clients: benches/README.md).
pub const OVERLAP_PAUSE: Duration = Duration::from_millis(20);

/// The longest `--poll-idle-us`, in microseconds: a core spun for longer is a core taken from other work, and the
/// runtime's timers and signals can wait for a poll.
pub const MAX_POLL_US: u64 = 10_000;

/// The watched sockets, and how long after an answer to poll them.
struct Doorbell {
    epoll: OwnedFd,
    poll_for: Duration,
}

impl Doorbell {
    fn new(poll_for: Duration) -> std::io::Result<Doorbell> {
        Ok(Doorbell { epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?, poll_for })
    }
}

static DOORBELL: OnceLock<Doorbell> = OnceLock::new();
/// The requests' work, across every model and protocol.
static REQUESTS: Requests = Requests::new();
/// Where [`Requests`]' clock starts.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Requests' work under way, when two overlapped last, the time to poll after work ended, and whether a thread
/// polls now. Times are microseconds from [`EPOCH`], plus one (0: never).
struct Requests {
    in_flight: AtomicUsize,
    overlapped_at: AtomicU64,
    /// A request's work ended since a park last looked: the next quiet park's time starts then.
    answered: AtomicBool,
    /// When the time to poll after the last work ended started: at the first quiet park after it.
    polling_since: AtomicU64,
    polling: AtomicBool,
}

impl Requests {
    const fn new() -> Requests {
        Requests {
            in_flight: AtomicUsize::new(0),
            overlapped_at: AtomicU64::new(0),
            answered: AtomicBool::new(false),
            polling_since: AtomicU64::new(0),
            polling: AtomicBool::new(false),
        }
    }

    fn enter(&self) {
        if self.in_flight.fetch_add(1, Ordering::Relaxed) > 0 {
            self.overlapped_at.store(stamp(), Ordering::Relaxed);
        }
    }

    fn leave(&self) {
        self.answered.store(true, Ordering::Relaxed);
        // Release, paired with `in_flight`'s Acquire: a thread that sees no work under way sees it answered.
        self.in_flight.fetch_sub(1, Ordering::Release);
    }

    fn in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// How long a thread may poll now: the whole of `poll_for` at the first look after work ended, what is left of
    /// it at the next ones, and zero while work is under way or for `pause` after two requests' work overlapped.
    /// Work that ended before such a pause does not start a time after it, nor does a time started before it go on.
    fn poll_left(&self, poll_for: Duration, pause: Duration) -> Duration {
        if self.in_flight() {
            return Duration::ZERO;
        }
        let answered = self.answered.swap(false, Ordering::Relaxed);
        let now = stamp();
        let since = |at: u64| Duration::from_micros(now.saturating_sub(at));
        let overlapped = self.overlapped_at.load(Ordering::Relaxed);
        if overlapped != 0 && since(overlapped) < pause {
            // An overlap ends the time too.
            self.polling_since.store(0, Ordering::Relaxed);
            return Duration::ZERO;
        }
        if answered {
            self.polling_since.store(now, Ordering::Relaxed);
            return poll_for;
        }
        match self.polling_since.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            started => poll_for.saturating_sub(since(started)),
        }
    }
}

/// Now, as [`Requests`] keeps its times.
fn stamp() -> u64 {
    u64::try_from(EPOCH.elapsed().as_micros()).unwrap_or(u64::MAX - 1) + 1
}

/// Turns polling on, for up to `poll_for` after each answer (zero leaves it off). Once per process: a second call
/// keeps the first's setting.
pub fn enable(poll_for: Duration) -> std::io::Result<()> {
    if poll_for.is_zero() || DOORBELL.get().is_some() {
        return Ok(());
    }
    let _ = DOORBELL.set(Doorbell::new(poll_for.min(Duration::from_micros(MAX_POLL_US)))?);
    Ok(())
}

/// Watches a listener or a connection for something to read, while polling is on. One that cannot be watched is
/// served as any other; only its next connection or request may find a sleeping core.
pub fn watch(socket: impl AsFd) {
    if let Some(bell) = DOORBELL.get() {
        let _ = epoll::add(&bell.epoll, socket, epoll::EventData::new_u64(0), epoll::EventFlags::IN);
    }
}

/// A request's work under way (in a batcher, or on the blocking pool): no thread polls until it ends (or is
/// dropped).
pub struct Busy(());

impl Drop for Busy {
    fn drop(&mut self) {
        REQUESTS.leave();
    }
}

/// Counts a request's work under way until the guard drops.
pub fn busy() -> Busy {
    REQUESTS.enter();
    Busy(())
}

/// The runtime's hook before a worker thread parks (see the module's documentation).
pub fn before_park() {
    if let Some(bell) = DOORBELL.get() {
        park_hook(bell, &REQUESTS);
    }
}

/// [`before_park`] over the given state: polls for what is left of the time, alone, and yields the thread's core
/// between polls to any other thread ready to run there.
fn park_hook(bell: &Doorbell, requests: &Requests) {
    if requests.poll_left(bell.poll_for, OVERLAP_PAUSE).is_zero() || requests.polling.swap(true, Ordering::Acquire) {
        return;
    }
    // A task woken from outside the runtime waits in its queue for a thread to unpark, and a polling thread counts
    // as one looking for work, so none is woken for it: the poll ends, and the thread parks and finds it.
    let runtime = tokio::runtime::Handle::try_current().ok().map(|h| h.metrics());
    poll(&bell.epoll, bell.poll_for, requests, || runtime.as_ref().is_some_and(|m| m.global_queue_depth() > 0));
    requests.polling.store(false, Ordering::Release);
}

/// Polls `epoll` until a socket in it has something to read, `queued` says a task waits, or `requests` leave no
/// time (work under way, or `poll_for` up since work last ended: work that ends meanwhile starts it again).
fn poll(epoll: &OwnedFd, poll_for: Duration, requests: &Requests, queued: impl Fn() -> bool) {
    let mut events = Vec::with_capacity(1);
    let now = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
    loop {
        events.clear();
        let ready = epoll::wait(epoll, rustix::buffer::spare_capacity(&mut events), Some(&now)).map_or(1, |n| n);
        if ready > 0 || queued() || requests.poll_left(poll_for, OVERLAP_PAUSE).is_zero() {
            return;
        }
        rustix::thread::sched_yield();
    }
}

#[cfg(test)]
#[path = "idle_tests.rs"]
mod tests;
