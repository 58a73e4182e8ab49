//! [`Repolled`]: wake-ups during a poll become polls on the spot, the rest reach the task, none is lost.

use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

use super::*;

/// A task's waker that counts its wake-ups.
struct Counted(AtomicUsize);

impl Wake for Counted {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn task() -> (Arc<Counted>, Waker) {
    let counted = Arc::new(Counted(AtomicUsize::new(0)));
    (counted.clone(), Waker::from(counted))
}

/// Wakes itself on each of its first `self_wakes` polls and is pending, then is ready with how often it was polled;
/// keeps each waker it was given.
struct WakesItself {
    self_wakes: usize,
    polls: usize,
    wakers: Arc<Mutex<Vec<Waker>>>,
}

impl Future for WakesItself {
    type Output = usize;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
        self.polls += 1;
        self.wakers.lock().expect("a test thread panicked").push(cx.waker().clone());
        if self.polls > self.self_wakes {
            return Poll::Ready(self.polls);
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

fn wakes_itself(self_wakes: usize) -> (WakesItself, Arc<Mutex<Vec<Waker>>>) {
    let wakers = Arc::new(Mutex::new(Vec::new()));
    (WakesItself { self_wakes, polls: 0, wakers: wakers.clone() }, wakers)
}

#[test]
fn a_future_that_wakes_itself_is_polled_again_at_once_without_waking_its_task() {
    let (counted, waker) = task();
    let (future, wakers) = wakes_itself(3);
    let mut repolled = Repolled::new(future);
    let polled = Pin::new(&mut repolled).poll(&mut Context::from_waker(&waker));
    assert_eq!(polled, Poll::Ready(4), "three self-wakes, so four polls, all in the task's one poll");
    assert_eq!(counted.0.load(Ordering::SeqCst), 0, "the task was not woken");
    let wakers = wakers.lock().expect("a test thread panicked");
    assert!(wakers.windows(2).all(|w| w[0].will_wake(&w[1])), "the future sees one waker on every poll");
    assert!(!wakers[0].will_wake(&waker), "the future is polled with the relay's waker, not the task's");
}

#[test]
fn a_future_that_keeps_waking_itself_still_yields() {
    let (counted, waker) = task();
    let (future, wakers) = wakes_itself(usize::MAX);
    let mut repolled = Repolled::new(future);
    let mut cx = Context::from_waker(&waker);
    assert_eq!(Pin::new(&mut repolled).poll(&mut cx), Poll::Pending);
    assert_eq!(
        wakers.lock().expect("a test thread panicked").len(),
        MAX_REPOLLS + 1,
        "polled once, then again MAX_REPOLLS times"
    );
    assert_eq!(counted.0.load(Ordering::SeqCst), 1, "then the task is woken to run again later");
    assert_eq!(Pin::new(&mut repolled).poll(&mut cx), Poll::Pending);
    assert_eq!(wakers.lock().expect("a test thread panicked").len(), 2 * (MAX_REPOLLS + 1));
    assert_eq!(counted.0.load(Ordering::SeqCst), 2);
}

#[test]
fn a_wake_up_between_polls_wakes_the_task_it_was_last_polled_by() {
    let (first, first_waker) = task();
    let (second, second_waker) = task();
    let mut polls = 0;
    // Pending on its first two polls without waking itself: the wake-ups come from outside.
    let mut repolled = Repolled::new(std::future::poll_fn(move |_| {
        polls += 1;
        if polls > 2 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }));
    assert_eq!(Pin::new(&mut repolled).poll(&mut Context::from_waker(&first_waker)), Poll::Pending);
    repolled.waker.wake_by_ref();
    assert_eq!(first.0.load(Ordering::SeqCst), 1, "woken outside a poll: the task is woken");
    assert_eq!(Pin::new(&mut repolled).poll(&mut Context::from_waker(&second_waker)), Poll::Pending);
    let owned = repolled.waker.clone();
    owned.wake(); // by value, as a waker handed away is
    assert_eq!(second.0.load(Ordering::SeqCst), 1, "the task's latest waker is the one woken");
    assert_eq!(first.0.load(Ordering::SeqCst), 1);
    assert_eq!(Pin::new(&mut repolled).poll(&mut Context::from_waker(&second_waker)), Poll::Ready(()));
}

#[test]
fn a_wake_up_from_another_thread_is_never_lost() {
    // Another thread sets a flag and wakes the future as it is being polled, or just before or after. Whichever
    // way the race goes, the poll sees the flag, polls again, or the task is woken to poll again.
    for _ in 0..300 {
        let (counted, waker) = task();
        let set = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = set.clone();
        let mut repolled = Repolled::new(std::future::poll_fn(move |_| {
            if set.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }));
        let relay = repolled.waker.clone();
        let gate = Arc::new(std::sync::Barrier::new(2));
        let opened = gate.clone();
        let setter = std::thread::spawn(move || {
            opened.wait();
            flag.store(true, Ordering::SeqCst);
            relay.wake();
        });
        gate.wait();
        let mut cx = Context::from_waker(&waker);
        let first = Pin::new(&mut repolled).poll(&mut cx);
        setter.join().expect("the setter panicked");
        if first.is_pending() {
            assert_eq!(counted.0.load(Ordering::SeqCst), 1, "pending, and the wake-up was lost");
            assert_eq!(Pin::new(&mut repolled).poll(&mut cx), Poll::Ready(()));
        }
    }
}

// `StreamsInline`. The tests without a runtime show that nothing was spawned: `tokio::spawn` panics outside one.

#[test]
fn a_stream_answered_at_once_runs_where_it_is_handed_over_without_a_task() {
    use hyper::rt::Executor;
    let ran = Arc::new(AtomicUsize::new(0));
    let seen = ran.clone();
    StreamsInline.execute(async move {
        seen.fetch_add(1, Ordering::SeqCst);
    });
    assert_eq!(ran.load(Ordering::SeqCst), 1, "done before execute returned");
}

#[test]
fn a_stream_that_wakes_itself_is_polled_again_inline() {
    use hyper::rt::Executor;
    // As a stream reserving room for its answer: given it at once, and woken for it.
    let (future, wakers) = wakes_itself(3);
    let polls = Arc::new(AtomicUsize::new(0));
    let seen = polls.clone();
    StreamsInline.execute(async move {
        seen.store(future.await, Ordering::SeqCst);
    });
    assert_eq!(polls.load(Ordering::SeqCst), 4, "three self-wakes, four polls, all before execute returned");
    assert_eq!(wakers.lock().expect("a test thread panicked").len(), 4);
}

#[tokio::test]
async fn a_stream_that_waits_is_spawned_and_finishes_when_woken() {
    use hyper::rt::Executor;
    // Woken before its task first runs (the wake-up reaches the waker of the poll inside execute), and after (it
    // must reach the task).
    for late in [false, true] {
        let (send, receive) = tokio::sync::oneshot::channel::<u32>();
        let (done, finished) = tokio::sync::oneshot::channel::<u32>();
        StreamsInline.execute(async move {
            let value = receive.await.expect("the sender was dropped");
            done.send(value + 1).expect("the test stopped waiting");
        });
        if late {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        send.send(41).expect("the stream was dropped");
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), finished).await;
        assert_eq!(answer.expect("the stream never finished: its wake-up was lost").expect("dropped"), 42, "{late}");
    }
}

#[test]
fn a_stream_that_panics_inline_is_dropped_and_the_connection_goes_on() {
    use hyper::rt::Executor;
    let dropped = Arc::new(AtomicUsize::new(0));
    struct Counts(Arc<AtomicUsize>);
    impl Drop for Counts {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let held = Counts(dropped.clone());
    StreamsInline.execute(async move {
        let _held = held;
        panic!("a stream's handler panicked");
    });
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the stream's state was dropped, and execute returned");
}
