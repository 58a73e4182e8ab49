use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use super::*;

fn watching(socket: &UnixStream) -> OwnedFd {
    let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).expect("an epoll set");
    epoll::add(&epoll, socket, epoll::EventData::new_u64(0), epoll::EventFlags::IN).expect("watched");
    epoll
}

fn timed(f: impl FnOnce()) -> Duration {
    let started = Instant::now();
    f();
    started.elapsed()
}

fn answered(requests: &Requests) {
    requests.enter();
    requests.leave();
}

const LONG: Duration = Duration::from_secs(20);

/// A socket with something to read ends the poll at once; one written to later ends it then.
#[test]
fn a_readable_socket_ends_the_poll() {
    let requests = Requests::new();
    let (mut client, server) = UnixStream::pair().expect("a pair");
    let epoll = watching(&server);
    client.write_all(b"x").expect("write");
    answered(&requests);
    let took = timed(|| poll(&epoll, LONG, &requests, || false));
    assert!(took < LONG / 2, "{took:?}");

    let (mut client, server) = UnixStream::pair().expect("a pair");
    let epoll = watching(&server);
    let started = Instant::now();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        let written = Instant::now();
        client.write_all(b"x").expect("write");
        (client, written)
    });
    answered(&requests);
    poll(&epoll, LONG, &requests, || false);
    let ended = Instant::now();
    let (_client, written) = writer.join().expect("writer");
    assert!(ended >= written && ended - started < LONG / 2, "{:?}", ended - started);
}

/// With nothing to read the poll lasts its time, started again by work that ends meanwhile; work under way, or a
/// task queued, ends it.
#[test]
fn the_poll_ends_with_its_time_work_under_way_or_a_task_queued() {
    let (_client, server) = UnixStream::pair().expect("a pair");
    let epoll = watching(&server);
    let requests = Arc::new(Requests::new());
    answered(&requests);
    let took = timed(|| poll(&epoll, Duration::from_millis(30), &requests, || false));
    assert!(took >= Duration::from_millis(30) && took < LONG / 2, "{took:?}");

    // Work that ends meanwhile, as the poll sees it once it has ended: an answer and no work under way. (Its
    // `enter` and `leave` from another thread could be seen between the two, work under way, which ends the poll
    // instead, as the next step checks: a thread preempted there made this step fail on a busy machine.)
    let again = requests.clone();
    let work = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        again.answered.store(true, Ordering::Relaxed);
    });
    answered(&requests);
    let took = timed(|| poll(&epoll, Duration::from_millis(30), &requests, || false));
    work.join().expect("thread");
    assert!(took >= Duration::from_millis(50) && took < LONG / 2, "{took:?}");

    let coming = requests.clone();
    let request = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        coming.enter();
    });
    answered(&requests);
    let took = timed(|| poll(&epoll, LONG, &requests, || false));
    request.join().expect("thread");
    assert!(took < LONG / 2, "{took:?}");
    assert!(requests.in_flight());

    let queued = Arc::new(AtomicBool::new(false));
    let queueing = queued.clone();
    let task = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        queueing.store(true, Ordering::Relaxed);
    });
    let fresh = Requests::new();
    answered(&fresh);
    let took = timed(|| poll(&epoll, LONG, &fresh, || queued.load(Ordering::Relaxed)));
    task.join().expect("thread");
    assert!(took < LONG / 2, "{took:?}");
}

/// The first park after an answer may poll the whole time, the next ones what is left of it; none may before any
/// answer, with a request in flight, or for a while after two were in flight at once.
#[test]
fn the_time_to_poll_follows_the_answers() {
    let requests = Requests::new();
    let pause = Duration::from_millis(20);
    assert_eq!(requests.poll_left(LONG, pause), Duration::ZERO, "no answer yet");
    for _ in 0..3 {
        requests.enter();
        assert_eq!(requests.poll_left(LONG, pause), Duration::ZERO, "in flight");
        requests.leave();
        assert_eq!(requests.poll_left(LONG, pause), LONG, "the first park after an answer");
        let left = requests.poll_left(LONG, pause);
        assert!(left > LONG / 2 && left <= LONG, "{left:?}");
    }
    answered(&requests);
    assert_eq!(requests.poll_left(Duration::from_millis(1), pause), Duration::from_millis(1));
    std::thread::sleep(Duration::from_millis(2));
    assert_eq!(requests.poll_left(Duration::from_millis(1), pause), Duration::ZERO, "its time is up");
    requests.enter();
    requests.enter();
    requests.leave();
    requests.leave();
    assert_eq!(requests.poll_left(LONG, Duration::from_secs(3600)), Duration::ZERO, "overlapped");
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(requests.poll_left(LONG, pause), Duration::ZERO, "work that ended before the pause");
    answered(&requests);
    assert_eq!(requests.poll_left(LONG, pause), LONG, "work that ended after it");
}

/// After an answer the hook polls its time; once it is up, the next park polls nothing.
#[test]
fn the_hook_polls_after_an_answer() {
    let bell = Doorbell::new(Duration::from_millis(100)).expect("an epoll set");
    let requests = Requests::new();
    answered(&requests);
    let polled = timed(|| park_hook(&bell, &requests));
    assert!(polled >= Duration::from_millis(100) && polled < LONG / 2, "{polled:?}");
    assert!(!requests.polling.load(Ordering::Acquire));
    assert_eq!(requests.poll_left(bell.poll_for, OVERLAP_PAUSE), Duration::ZERO, "its time is up");
}

/// While one thread polls, another polls nothing.
#[test]
fn one_thread_polls_at_a_time() {
    let bell = Arc::new(Doorbell::new(LONG).expect("an epoll set"));
    let requests = Arc::new(Requests::new());
    answered(&requests);
    let (b, r) = (bell.clone(), requests.clone());
    let first = std::thread::spawn(move || timed(|| park_hook(&b, &r)));
    let started = Instant::now();
    while !requests.polling.load(Ordering::Acquire) {
        assert!(started.elapsed() < LONG / 2, "the first thread does not poll");
        std::thread::yield_now();
    }
    let second = timed(|| park_hook(&bell, &requests));
    // A request in flight ends the first thread's poll.
    requests.enter();
    let first = first.join().expect("first");
    assert!(second < LONG / 4 && first < LONG / 2, "{second:?} {first:?}");
    assert!(!requests.polling.load(Ordering::Acquire));
}

/// A task woken from outside the runtime (here by the blocking pool) is not left waiting for the poll to end:
/// a polling worker counts as looking for work, so no other is woken for it.
#[test]
fn a_task_woken_from_another_thread_ends_the_poll() {
    let bell = Arc::new(Doorbell::new(Duration::from_secs(5)).expect("an epoll set"));
    let requests = Arc::new(Requests::new());
    let (b, r) = (bell.clone(), requests.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_park(move || park_hook(&b, &r))
        .build()
        .expect("a runtime");
    let answers = requests.clone();
    let waits = runtime.block_on(async move {
        let task = tokio::spawn(async move {
            let mut waits = Vec::new();
            for _ in 0..5 {
                answered(&answers);
                let started = Instant::now();
                tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(10))).await.expect("blocking");
                waits.push(started.elapsed());
            }
            waits
        });
        task.await.expect("task")
    });
    // A request in flight ends any poll, so that the runtime shuts down at once.
    requests.enter();
    drop(runtime);
    assert!(waits.iter().all(|w| *w < Duration::from_millis(2500)), "{waits:?}");
}

/// The server's hook returns at once while a request is in a batcher, though polling is on for long.
#[test]
fn the_hook_does_not_poll_while_a_request_is_in_flight() {
    enable(LONG).expect("an epoll set");
    let in_flight = busy();
    let took = timed(before_park);
    drop(in_flight);
    assert!(took < LONG / 2, "{took:?}");
}
