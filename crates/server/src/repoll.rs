//! A connection's task polled again at once when it wakes itself, instead of handed to another worker thread.
//!
//! A handler runs inside its connection's task, and reading a request's body wakes that task: hyper's body channel
//! holds one chunk, and the handler taking it wakes the sender, which is the connection itself. Tokio takes a task
//! woken while it runs for one that yielded: it goes to the back of the queue and an idle worker thread is woken to
//! come and take it, a futex wake-up, a thread's wake and sleep, and often the task moved to the other core, on
//! every request with a body. [`Repolled`] keeps the wake-ups that come while its future is being polled and polls
//! it again on the spot, up to [`MAX_REPOLLS`] times in a row; past those it passes the wake-up on, so a future
//! that keeps waking itself (tokio's cooperative budget spent, say) still yields as before. A wake-up from
//! anywhere while the future is not being polled goes straight to the task.
//!
//! Over HTTP/2 hyper hands each request's stream to an executor, to run beside the connection. [`StreamsInline`]
//! runs it in the connection's task first, [`Repolled`], from where hyper hands it over: a stream whose request
//! came whole and is answered at once (a small model's lone request, run inline on its idle worker) is done there,
//! without a task of its own, two more polls of tasks and the connection's wake-up by the stream. One that is not
//! done is spawned as before, and carries on in a task of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// How many times in a row a future that woke itself while polled is polled again before its task yields.
pub const MAX_REPOLLS: usize = 8;

/// Not being polled: a wake-up goes to the task.
const IDLE: u8 = 0;
/// Being polled: a wake-up is kept, for the poll to see.
const POLLING: u8 = 1;
/// Being polled, and woken meanwhile.
const WOKEN: u8 = 2;

/// A future whose self-wake-ups are turned into polls on the spot (see the module's documentation).
pub struct Repolled<F> {
    future: Pin<Box<F>>,
    relay: Arc<Relay>,
    /// The waker the future is polled with: `relay`'s, made once so the future's resources see the same waker on
    /// every poll and keep their registrations.
    waker: Waker,
}

/// Where the future's wake-ups arrive, from any thread.
struct Relay {
    /// [`IDLE`], [`POLLING`] or [`WOKEN`]: set by the poll, moved to `WOKEN` by a wake-up during it.
    state: AtomicU8,
    /// The task's own waker, as of its latest poll: what a wake-up outside a poll wakes.
    task: AtomicWaker,
}

impl<F: Future> Repolled<F> {
    pub fn new(future: F) -> Self {
        let relay = Arc::new(Relay { state: AtomicU8::new(IDLE), task: AtomicWaker::new() });
        Repolled { future: Box::pin(future), waker: Waker::from(relay.clone()), relay }
    }
}

impl<F: Future> Future for Repolled<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.relay.task.register(cx.waker());
        let mut own = Context::from_waker(&this.waker);
        for _ in 0..=MAX_REPOLLS {
            this.relay.state.store(POLLING, Ordering::SeqCst);
            let polled = this.future.as_mut().poll(&mut own);
            let state = this.relay.state.swap(IDLE, Ordering::SeqCst);
            if polled.is_ready() || state != WOKEN {
                return polled;
            }
        }
        // Woken on every poll: the task yields, as it would have without this.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // During a poll the wake-up is left for the poll to see (a second one is the same as the first); outside
        // one it goes to the task. A poll that ends between the two reads finds IDLE and wakes the task.
        if self.state.compare_exchange(POLLING, WOKEN, Ordering::SeqCst, Ordering::SeqCst).is_ok()
            || self.state.load(Ordering::SeqCst) == WOKEN
        {
            return;
        }
        self.task.wake();
    }
}

/// hyper's executor for an HTTP/2 connection's streams (see the module's documentation): each stream is polled at
/// once where hyper hands it over, inside the connection's poll, and spawned only if that does not finish it. A
/// stream that panics there is dropped, as a task that panics is, and its connection goes on.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamsInline;

impl<F> hyper::rt::Executor<F> for StreamsInline
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        let mut stream = Repolled::new(stream);
        // No task to wake yet: a wake-up before the spawned task's first poll is seen by that poll.
        let mut cx = Context::from_waker(Waker::noop());
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Pin::new(&mut stream).poll(&mut cx))) {
            Ok(Poll::Ready(())) | Err(_) => {}
            Ok(Poll::Pending) => {
                tokio::spawn(stream);
            }
        }
    }
}

#[cfg(test)]
#[path = "repoll_tests.rs"]
mod tests;
