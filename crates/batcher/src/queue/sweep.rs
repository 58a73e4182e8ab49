//! Taking requests out of a queue: the dead ones (their client gone, their deadline passed), and those a batch takes.

use std::collections::VecDeque;
use std::time::Instant;

use super::Pending;
use crate::request::BatchError;

/// Removes the requests whose client went away, and answers those past their deadline.
pub(crate) fn drop_dead_requests<C>(requests: &mut C, now: Instant)
where
    C: Default + IntoIterator<Item = Pending> + FromIterator<Pending>,
    for<'a> &'a C: IntoIterator<Item = &'a Pending>,
{
    if (&*requests).into_iter().any(|p| p.abandoned() || p.expired(now)) {
        *requests = std::mem::take(requests).into_iter().filter_map(|p| answer_if_dead(p, now)).collect();
    }
}

fn answer_if_dead(p: Pending, now: Instant) -> Option<Pending> {
    if p.abandoned() {
        None
    } else if p.expired(now) {
        tracing::debug!(parent: &p.span, "the deadline passed in the queue");
        let _ = p.reply.send(Err(BatchError::DeadlineExceeded));
        None
    } else {
        Some(p)
    }
}

/// Removes the requests at `positions` (ascending) from the queue, in order.
pub(super) fn take_positions(queue: &mut VecDeque<Pending>, positions: &[usize]) -> Vec<Pending> {
    let mut taken = Vec::with_capacity(positions.len());
    let mut kept = VecDeque::with_capacity(queue.len().saturating_sub(positions.len()));
    let mut next = positions.iter().peekable();
    for (i, p) in queue.drain(..).enumerate() {
        if next.peek() == Some(&&i) {
            next.next();
            taken.push(p);
        } else {
            kept.push_back(p);
        }
    }
    *queue = kept;
    taken
}
