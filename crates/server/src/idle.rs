//! A core kept awake between requests (`--poll-idle-us`). A runtime thread that runs out of work parks in
//! `epoll_wait`, and the next request wakes it on a core that has gone idle: on the virtual machines inferd is
//! measured on, whatever runs first after such a sleep runs slowly (ONNX Runtime's run of a digits row, called from
//! Python, took 10 µs back to back and 30 µs after any sleep from 20 µs to 1 ms, but 10 µs after 100 µs of spinning;
//! benches/README.md). So, while requests come one at a time, a runtime thread about to park first polls the
//! server's connections for up to the set time, without sleeping, and parks once one of them has something to read
//! (its runtime then finds it at once) or the time is up. One thread polls at a time; none does while a request is
//! in flight, nor for [`OVERLAP_PAUSE`] after two were in flight at once, so under load the cores stay with the
//! batches and their clients.
//!
//! The connections are watched through an epoll set of this module's own, level-triggered ([`watch`] on each
//! accepted one; a closed one leaves it by itself). The runtime's hook is [`before_park`]; the server turns it on
//! with [`enable`]. Where it is off (the runtimes of tests, `--poll-idle-us 0`) the hook returns at once.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use rustix::event::epoll;

/// How long after two requests were last in flight at once no thread polls: polling is for a lone client's
/// stream of requests, and where requests overlap the cores have work enough (polling there took CPU from the
/// batches and the clients: benches/README.md).
pub const OVERLAP_PAUSE: Duration = Duration::from_millis(20);

/// The watched connections, and how long to poll them.
struct Doorbell {
    epoll: OwnedFd,
    poll_for: Duration,
}

static DOORBELL: OnceLock<Doorbell> = OnceLock::new();
/// The requests in the batchers, across every model and protocol.
static REQUESTS: Requests = Requests::new();
/// Where [`Requests`]' clock starts.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Requests in flight, when two last overlapped, and whether a thread polls now.
struct Requests {
    in_flight: AtomicUsize,
    /// Microseconds from [`EPOCH`] to the last time a request came while another was in flight, plus one (0: never).
    overlapped_at: AtomicU64,
    polling: AtomicBool,
}

impl Requests {
    const fn new() -> Requests {
        Requests { in_flight: AtomicUsize::new(0), overlapped_at: AtomicU64::new(0), polling: AtomicBool::new(false) }
    }

    fn enter(&self) {
        if self.in_flight.fetch_add(1, Ordering::Relaxed) > 0 {
            self.overlapped_at.store(since_epoch() + 1, Ordering::Relaxed);
        }
    }

    fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    fn in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) > 0
    }

    /// Nothing in flight, and no two requests in flight at once for `pause`.
    fn quiet(&self, pause: Duration) -> bool {
        let at = self.overlapped_at.load(Ordering::Relaxed);
        !self.in_flight() && (at == 0 || (since_epoch() + 1).saturating_sub(at) >= pause.as_micros() as u64)
    }
}

fn since_epoch() -> u64 {
    EPOCH.elapsed().as_micros() as u64
}

/// Turns polling on, for `poll_for` before each park (zero leaves it off). Once per process: a second call keeps
/// the first's setting.
pub fn enable(poll_for: Duration) -> std::io::Result<()> {
    if poll_for.is_zero() || DOORBELL.get().is_some() {
        return Ok(());
    }
    let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    let _ = DOORBELL.set(Doorbell { epoll, poll_for });
    Ok(())
}

/// Watches `connection` for something to read, while polling is on. A connection that cannot be watched is served
/// as any other; only its next request may find a sleeping core.
pub fn watch(connection: impl AsFd) {
    if let Some(bell) = DOORBELL.get() {
        let _ = epoll::add(&bell.epoll, connection, epoll::EventData::new_u64(0), epoll::EventFlags::IN);
    }
}

/// A request in flight: no thread polls until it is answered (or dropped).
pub struct Busy(());

impl Drop for Busy {
    fn drop(&mut self) {
        REQUESTS.leave();
    }
}

/// Counts a request in flight until the guard drops.
pub fn busy() -> Busy {
    REQUESTS.enter();
    Busy(())
}

/// The runtime's hook before a worker thread parks: polls the connections for up to the set time while the
/// requests are quiet (see [`OVERLAP_PAUSE`]) and no other thread polls. Between polls the thread yields to any
/// other that is ready to run on its core.
pub fn before_park() {
    let Some(bell) = DOORBELL.get() else { return };
    if !REQUESTS.quiet(OVERLAP_PAUSE) || REQUESTS.polling.swap(true, Ordering::Acquire) {
        return;
    }
    poll(&bell.epoll, bell.poll_for, &REQUESTS);
    REQUESTS.polling.store(false, Ordering::Release);
}

/// Polls `epoll` until a connection in it has something to read, a request is in flight, or `poll_for` is up.
fn poll(epoll: &OwnedFd, poll_for: Duration, requests: &Requests) {
    let started = Instant::now();
    let mut events = Vec::with_capacity(1);
    let now = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
    loop {
        events.clear();
        let ready = epoll::wait(epoll, rustix::buffer::spare_capacity(&mut events), Some(&now)).map_or(1, |n| n);
        if ready > 0 || requests.in_flight() || started.elapsed() >= poll_for {
            return;
        }
        rustix::thread::sched_yield();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    use super::*;

    fn watching(connection: &UnixStream) -> OwnedFd {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).expect("an epoll set");
        epoll::add(&epoll, connection, epoll::EventData::new_u64(0), epoll::EventFlags::IN).expect("watched");
        epoll
    }

    fn timed(f: impl FnOnce()) -> Duration {
        let started = Instant::now();
        f();
        started.elapsed()
    }

    /// A connection with something to read ends the poll at once; one written to later ends it then.
    #[test]
    fn a_readable_connection_ends_the_poll() {
        let none = Requests::new();
        let (mut client, server) = UnixStream::pair().expect("a pair");
        let epoll = watching(&server);
        client.write_all(b"x").expect("write");
        let took = timed(|| poll(&epoll, Duration::from_secs(20), &none));
        assert!(took < Duration::from_secs(10), "{took:?}");

        let (mut client, server) = UnixStream::pair().expect("a pair");
        let epoll = watching(&server);
        let late = Duration::from_millis(50);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(late);
            client.write_all(b"x").expect("write");
            client
        });
        let took = timed(|| poll(&epoll, Duration::from_secs(20), &none));
        let _client = writer.join().expect("writer");
        assert!(took >= late && took < Duration::from_secs(10), "{took:?}");
    }

    /// With nothing to read the poll lasts its time; a request coming in flight ends it.
    #[test]
    fn the_poll_ends_with_its_time_or_a_request_in_flight() {
        let (_client, server) = UnixStream::pair().expect("a pair");
        let epoll = watching(&server);
        let requests = Arc::new(Requests::new());
        let took = timed(|| poll(&epoll, Duration::from_millis(30), &requests));
        assert!(took >= Duration::from_millis(30) && took < Duration::from_secs(10), "{took:?}");

        let coming = requests.clone();
        let request = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            coming.enter();
        });
        let took = timed(|| poll(&epoll, Duration::from_secs(20), &requests));
        request.join().expect("thread");
        assert!(took >= Duration::from_millis(20) && took < Duration::from_secs(10), "{took:?}");
    }

    /// Lone requests, one after another, leave the requests quiet between them; two in flight at once pause
    /// polling for a while after the last of them is answered.
    #[test]
    fn overlapping_requests_pause_polling() {
        let requests = Requests::new();
        let long = Duration::from_secs(3600);
        assert!(requests.quiet(long));
        for _ in 0..3 {
            requests.enter();
            assert!(!requests.quiet(long));
            requests.leave();
            assert!(requests.quiet(long));
        }
        requests.enter();
        requests.enter();
        requests.leave();
        requests.leave();
        assert!(!requests.quiet(long));
        std::thread::sleep(Duration::from_millis(30));
        assert!(requests.quiet(Duration::from_millis(20)));
        assert!(!requests.quiet(long));
    }

    /// The hook returns at once while a request is in flight, though polling is on for long.
    #[test]
    fn the_hook_does_not_poll_while_a_request_is_in_flight() {
        enable(Duration::from_secs(20)).expect("an epoll set");
        let in_flight = busy();
        let took = timed(before_park);
        drop(in_flight);
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
}
