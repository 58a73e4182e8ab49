//! Lending an idle worker's engine to the caller of a lone request, who runs it inline on its own thread: the part
//! of [`Queue`] that decides when, and gives the worker back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Answer, Pending, Queue, State};

/// How long requests run no more inline once one has come while another ran inline: under a steady load a lone
/// request still finds its worker idle now and then, and running it inline would make the requests that come
/// meanwhile each a batch of its own (benches/README.md, "Running a lone request inline").
pub(super) const INLINE_PAUSE: Duration = Duration::from_millis(20);

/// How often a lent worker whose idle release has come due looks whether its loan has ended.
pub(super) const LENT_RECHECK: Duration = Duration::from_millis(10);

/// What [`Queue::admit`] did with a request.
pub(crate) struct Admitted<'a> {
    /// Where each piece's answer arrives, in order.
    pub(crate) answers: Vec<Answer>,
    /// The queue's depth after.
    pub(crate) depth: usize,
    /// A batch for the caller to run itself on the engine of the worker lent to it.
    pub(crate) inline: Option<Inline<'a>>,
}

/// A batch of one lone request, and the idle worker whose engine runs it on the caller's thread. Dropping it ends
/// the loan, however the run ended (a panic included), so that the worker is never left lent.
pub(crate) struct Inline<'a> {
    queue: &'a Queue,
    pub(crate) worker: usize,
    batch: Vec<Pending>,
}

impl Inline<'_> {
    /// The batch to run; the loan lasts until `self` drops.
    pub(crate) fn take_batch(&mut self) -> Vec<Pending> {
        std::mem::take(&mut self.batch)
    }
}

impl Drop for Inline<'_> {
    fn drop(&mut self) {
        self.queue.inline_done(self.worker);
    }
}

impl Queue {
    /// Lends an idle worker to the caller whose lone request is the one batch `cut` has just cut, if it may run
    /// inline: nothing else is queued or waiting for a worker, the model's batches are short (by their moving
    /// averages, scaled to the request's rows), and no request has come while another ran inline for the last
    /// [`INLINE_PAUSE`].
    pub(super) fn lend<'a>(&'a self, state: &mut State, now: Instant) -> Option<Inline<'a>> {
        let limit = self.inline_under?;
        let rows = match (state.ready.len(), state.ready.back().map(Vec::as_slice), state.queue.is_empty()) {
            (1, Some([lone]), true) => lone.rows as u128,
            _ => return None,
        };
        let took = |average: &AtomicU64| u128::from(average.load(Ordering::Relaxed));
        let expected = took(&self.batch_ns).max(took(&self.row_ns).saturating_mul(rows));
        if expected >= limit.as_nanos() || state.inline_paused_until.is_some_and(|until| now < until) {
            return None;
        }
        let worker = (0..state.lent.len()).find(|&w| state.waiting[w] && !state.lent[w])?;
        let batch = state.ready.pop_back()?;
        state.ready_requests -= 1;
        state.lent[worker] = true;
        state.running[worker] = Some(now);
        Some(Inline { queue: self, worker, batch })
    }

    /// A batch of `rows` rows took `took`: the moving averages (of weight 1/8) that decide whether lone requests
    /// run inline.
    pub(crate) fn batch_took(&self, took: Duration, rows: usize) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        // Two workers finishing at once may lose one of their figures: the averages move a little later.
        for (average, figure) in [(&self.batch_ns, ns), (&self.row_ns, ns / rows.max(1) as u64)] {
            let old = average.load(Ordering::Relaxed);
            let new = if old == u64::MAX { figure } else { old - old / 8 + figure / 8 };
            average.store(new, Ordering::Relaxed);
        }
    }

    /// The caller has run the batch lent to it: the worker is its own again, and what queued meanwhile is cut.
    fn inline_done(&self, worker: usize) {
        let mut state = self.lock();
        state.lent[worker] = false;
        state.running[worker] = None;
        let (wait, cut) = self.cut(&mut state, Instant::now());
        // A batch cut before the loan and not yet taken has its worker woken again: the wake-up it had may have
        // gone to the lent worker, which took nothing.
        let wake = cut.max(usize::from(!state.ready.is_empty()));
        let (lent, stopping) = (state.loans() > 0, state.stopping);
        drop(state);
        if stopping {
            // The worker may be waiting only for its loan to end, to exit.
            self.work_ready.notify_all();
        } else {
            self.wake_workers(wake, lent);
        }
        if wait.is_some() {
            self.control.notify_all();
        }
    }
}
