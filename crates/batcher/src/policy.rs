//! The batching decision: a pure function of (queue, policy, now) that says which requests run next and why.

use std::time::{Duration, Instant};

use inferd_core::BatchingConfig;

/// How batches are cut, from a model's `[batching]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub max_batch_size: usize,
    /// Extra wait for a fuller batch; zero runs whatever is queued as soon as a worker is free.
    pub max_queue_delay: Duration,
    /// Ascending.
    pub preferred_batch_sizes: Vec<usize>,
}

impl Policy {
    pub fn from_config(config: &BatchingConfig) -> Self {
        let mut preferred = config.preferred_batch_sizes.clone();
        preferred.sort_unstable();
        preferred.dedup();
        Policy {
            max_batch_size: config.max_batch_size,
            max_queue_delay: Duration::from_micros(config.max_queue_delay_us),
            preferred_batch_sizes: preferred,
        }
    }
}

/// What the decision sees of one queued request. `key` groups requests that may share a batch (same data types
/// and non-batch dimensions); the queue is in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<K> {
    pub rows: usize,
    pub key: K,
    pub enqueued_at: Instant,
}

/// Why a batch was cut where it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The next request would not fit under `max_batch_size` (or the batch is exactly full).
    MaxBatchSize,
    /// The queued rows reach a preferred batch size.
    PreferredSize,
    /// The oldest request has waited `max_queue_delay`.
    QueueDelay,
    /// No delay is configured and a worker is free: run what is there.
    WorkConserving,
    /// Draining: run what is there without waiting for a fuller batch.
    Flush,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run the requests at these queue positions (ascending), `rows` rows in all.
    Run { positions: Vec<usize>, rows: usize, reason: StopReason },
    /// Nothing should run before this instant unless the queue changes.
    WaitUntil(Instant),
    /// The queue is empty.
    Idle,
}

/// Decides the next batch for a free worker. Groups are considered oldest first; a group that must still wait
/// for its delay does not hold back another that is ready, so one shape never blocks another. Within a group
/// requests are taken whole, in arrival order; each one has at most `max_batch_size` rows (larger requests are
/// split before they are queued). With `flush`, nothing waits.
pub fn decide<K: PartialEq>(queue: &[Candidate<K>], policy: &Policy, now: Instant, flush: bool) -> Decision {
    let mut earliest_wait: Option<Instant> = None;
    for (first, head) in queue.iter().enumerate() {
        // Visit each group once, at its oldest member.
        if queue[..first].iter().any(|c| c.key == head.key) {
            continue;
        }
        let mut positions = Vec::new();
        let mut rows = 0usize;
        let mut full = false;
        let mut preferred_cut: Option<(usize, usize)> = None; // (positions taken, rows)
        for (i, c) in queue.iter().enumerate().skip(first).filter(|(_, c)| c.key == head.key) {
            if rows + c.rows > policy.max_batch_size {
                full = true;
                break;
            }
            rows += c.rows;
            positions.push(i);
            if policy.preferred_batch_sizes.binary_search(&rows).is_ok() {
                preferred_cut = Some((positions.len(), rows));
            }
            if rows == policy.max_batch_size {
                full = true;
                break;
            }
        }
        if full {
            return Decision::Run { positions, rows, reason: StopReason::MaxBatchSize };
        }
        if let Some((taken, cut_rows)) = preferred_cut {
            positions.truncate(taken);
            return Decision::Run { positions, rows: cut_rows, reason: StopReason::PreferredSize };
        }
        if flush {
            return Decision::Run { positions, rows, reason: StopReason::Flush };
        }
        if policy.max_queue_delay.is_zero() {
            return Decision::Run { positions, rows, reason: StopReason::WorkConserving };
        }
        let due = head.enqueued_at + policy.max_queue_delay;
        if now >= due {
            return Decision::Run { positions, rows, reason: StopReason::QueueDelay };
        }
        earliest_wait = Some(earliest_wait.map_or(due, |w| w.min(due)));
    }
    earliest_wait.map_or(Decision::Idle, Decision::WaitUntil)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max: usize, delay_us: u64, preferred: &[usize]) -> Policy {
        Policy::from_config(&BatchingConfig {
            max_batch_size: max,
            max_queue_delay_us: delay_us,
            preferred_batch_sizes: preferred.to_vec(),
            ..BatchingConfig::default()
        })
    }

    /// A queue from (rows, key, microseconds after t0) triples.
    fn queue(t0: Instant, items: &[(usize, u8, u64)]) -> Vec<Candidate<u8>> {
        items
            .iter()
            .map(|&(rows, key, at)| Candidate { rows, key, enqueued_at: t0 + Duration::from_micros(at) })
            .collect()
    }

    fn run(positions: &[usize], rows: usize, reason: StopReason) -> Decision {
        Decision::Run { positions: positions.to_vec(), rows, reason }
    }

    #[test]
    fn empty_queue_is_idle() {
        assert_eq!(decide::<u8>(&[], &policy(8, 0, &[]), Instant::now(), false), Decision::Idle);
    }

    #[test]
    fn work_conserving_runs_a_lone_request_at_once() {
        let t0 = Instant::now();
        let q = queue(t0, &[(1, 0, 0)]);
        assert_eq!(decide(&q, &policy(8, 0, &[]), t0, false), run(&[0], 1, StopReason::WorkConserving));
    }

    #[test]
    fn work_conserving_takes_everything_queued_up_to_the_max() {
        let t0 = Instant::now();
        let q = queue(t0, &[(3, 0, 0), (2, 0, 1), (2, 0, 2)]);
        assert_eq!(decide(&q, &policy(8, 0, &[]), t0, false), run(&[0, 1, 2], 7, StopReason::WorkConserving));
    }

    #[test]
    fn a_request_that_would_overflow_stops_the_batch() {
        let t0 = Instant::now();
        let q = queue(t0, &[(3, 0, 0), (4, 0, 1), (2, 0, 2)]);
        assert_eq!(decide(&q, &policy(8, 0, &[]), t0, false), run(&[0, 1], 7, StopReason::MaxBatchSize));
    }

    #[test]
    fn an_exactly_full_batch_stops_at_the_max() {
        let t0 = Instant::now();
        let q = queue(t0, &[(4, 0, 0), (4, 0, 1), (1, 0, 2)]);
        assert_eq!(decide(&q, &policy(8, 1_000, &[]), t0, false), run(&[0, 1], 8, StopReason::MaxBatchSize));
    }

    #[test]
    fn with_a_delay_a_small_batch_waits_for_the_oldest_deadline() {
        let t0 = Instant::now();
        let q = queue(t0, &[(1, 0, 0), (1, 0, 50)]);
        let p = policy(8, 100, &[]);
        assert_eq!(
            decide(&q, &p, t0 + Duration::from_micros(60), false),
            Decision::WaitUntil(t0 + Duration::from_micros(100))
        );
        assert_eq!(decide(&q, &p, t0 + Duration::from_micros(100), false), run(&[0, 1], 2, StopReason::QueueDelay));
    }

    #[test]
    fn flush_does_not_wait_for_the_delay() {
        let t0 = Instant::now();
        let q = queue(t0, &[(1, 0, 0)]);
        assert_eq!(decide(&q, &policy(8, 1_000_000, &[]), t0, true), run(&[0], 1, StopReason::Flush));
    }

    #[test]
    fn preferred_size_cuts_at_the_largest_preferred_prefix() {
        let t0 = Instant::now();
        let q = queue(t0, &[(2, 0, 0), (2, 0, 1), (1, 0, 2), (1, 0, 3)]);
        // Prefix sums 2, 4, 5, 6: 4 is the largest preferred size reached.
        assert_eq!(decide(&q, &policy(8, 1_000, &[2, 4, 7]), t0, false), run(&[0, 1], 4, StopReason::PreferredSize));
    }

    #[test]
    fn preferred_size_not_reached_waits_like_any_batch() {
        let t0 = Instant::now();
        let q = queue(t0, &[(1, 0, 0), (1, 0, 1)]);
        let p = policy(8, 1_000, &[4]);
        assert_eq!(decide(&q, &p, t0, false), Decision::WaitUntil(t0 + Duration::from_millis(1)));
        assert_eq!(decide(&q, &p, t0 + Duration::from_millis(1), false), run(&[0, 1], 2, StopReason::QueueDelay));
    }

    #[test]
    fn requests_batch_only_with_their_own_shape() {
        let t0 = Instant::now();
        let q = queue(t0, &[(1, 0, 0), (1, 1, 1), (1, 0, 2), (1, 1, 3)]);
        assert_eq!(decide(&q, &policy(8, 0, &[]), t0, false), run(&[0, 2], 2, StopReason::WorkConserving));
    }

    #[test]
    fn a_waiting_shape_does_not_block_a_ready_one() {
        let t0 = Instant::now();
        // Group 0 is oldest but small; group 1 is full.
        let q = queue(t0, &[(1, 0, 0), (4, 1, 1), (4, 1, 2)]);
        assert_eq!(decide(&q, &policy(8, 1_000, &[]), t0, false), run(&[1, 2], 8, StopReason::MaxBatchSize));
    }

    #[test]
    fn the_earliest_deadline_of_all_waiting_groups_is_reported() {
        let t0 = Instant::now();
        let q = queue(t0, &[(1, 0, 300), (1, 1, 100)]);
        let p = policy(8, 1_000, &[]);
        assert_eq!(
            decide(&q, &p, t0 + Duration::from_micros(300), false),
            Decision::WaitUntil(t0 + Duration::from_micros(1_100))
        );
        // The younger group's deadline passes first; it runs even though it is not at the head of the queue.
        assert_eq!(decide(&q, &p, t0 + Duration::from_micros(1_100), false), run(&[1], 1, StopReason::QueueDelay));
    }

    #[test]
    fn policy_sorts_and_dedups_preferred_sizes() {
        assert_eq!(policy(8, 0, &[4, 2, 4]).preferred_batch_sizes, vec![2, 4]);
    }
}
