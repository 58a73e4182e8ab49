//! Lending an idle worker's engine to the caller of a lone request, who runs it inline on its own thread: the part
//! of [`Queue`] that decides when, and gives the worker back.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Answer, Pending, Queue, State};

/// How long requests run no more inline once one has come while another ran inline: under a steady load a lone
/// request still finds its worker idle now and then, and running it inline would make the requests that come
/// meanwhile each a batch of its own (benches/README.md, "Running a lone request inline").
pub(super) const INLINE_PAUSE: Duration = Duration::from_millis(20);

/// What [`Queue::admit`] did with a request.
pub(crate) struct Admitted {
    /// Where each piece's answer arrives, in order.
    pub(crate) answers: Vec<Answer>,
    /// The queue's depth after.
    pub(crate) depth: usize,
    /// A batch for the caller to run itself on the engine of the worker lent to it.
    pub(crate) inline: Option<Inline>,
}

/// A batch of one lone request, and the idle worker whose engine runs it on the caller's thread.
pub(crate) struct Inline {
    pub(crate) worker: usize,
    pub(crate) batch: Vec<Pending>,
}

impl Queue {
    /// Lends an idle worker to the caller whose lone request is the batch `cut` has just cut, if it may run inline:
    /// the model's batches are short, by their moving average, and no request has come while another ran inline
    /// for the last [`INLINE_PAUSE`].
    pub(super) fn lend(&self, state: &mut State, now: Instant) -> Option<Inline> {
        let quick = self.inline_under.is_some_and(|limit| {
            u128::from(self.batch_ns.load(Ordering::Relaxed)) < limit.as_nanos()
                && state.inline_paused_until.is_none_or(|until| until <= now)
        });
        if !quick || state.ready.back().is_none_or(|b| b.len() != 1) {
            return None;
        }
        let worker = (0..state.lent.len()).find(|&w| state.running[w].is_none() && !state.lent[w])?;
        let batch = state.ready.pop_back()?;
        state.ready_requests -= 1;
        state.lent[worker] = true;
        state.loans += 1;
        state.running[worker] = Some(now);
        Some(Inline { worker, batch })
    }

    /// A batch took `took`: the moving average (of weight 1/8) that decides whether lone requests run inline.
    pub(crate) fn batch_took(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        // Two workers finishing at once may lose one of their figures: the average moves a little later.
        let old = self.batch_ns.load(Ordering::Relaxed);
        let new = if old == u64::MAX { ns } else { old - old / 8 + ns / 8 };
        self.batch_ns.store(new, Ordering::Relaxed);
    }

    /// The caller has run the batch lent to it: the worker is its own again, and what queued meanwhile is cut.
    pub(crate) fn inline_done(&self, worker: usize) {
        let mut state = self.lock();
        state.lent[worker] = false;
        state.loans -= 1;
        state.running[worker] = None;
        let (wait, cut) = self.cut(&mut state, Instant::now());
        let (lent, stopping) = (state.loans > 0, state.stopping);
        drop(state);
        if stopping {
            // The worker may be waiting only for its loan to end, to exit.
            self.work_ready.notify_all();
        } else {
            self.wake_workers(cut, lent);
        }
        if wait.is_some() {
            self.control.notify_all();
        }
    }
}
