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
    /// Text models: padded tokens (rows × the longest sequence) per batch at most. Sequences of similar lengths
    /// batch together, and a batch takes no sequence that would make its padding waste exceed
    /// [`MAX_PADDING_WASTE`]. `None` for models of fixed shapes.
    pub max_batch_tokens: Option<usize>,
}

/// The most padding a text batch may carry: padded tokens over real tokens. Measured on mixed lengths it keeps
/// batches large at c=64 while the engine computes at most a quarter more than the real tokens need.
pub const MAX_PADDING_WASTE: f64 = 1.25;

impl Policy {
    /// The policy of a model's `[batching]` table; `sequences` for a text model, whose batches are bounded by
    /// tokens too.
    pub fn from_config(config: &BatchingConfig, sequences: bool) -> Self {
        if config.max_batch_size == 0 {
            // No batching: each request is a batch of its own, which waiting cannot make fuller.
            return Policy {
                max_batch_size: 1,
                max_queue_delay: Duration::ZERO,
                preferred_batch_sizes: Vec::new(),
                max_batch_tokens: None,
            };
        }
        let mut preferred = config.preferred_batch_sizes.clone();
        preferred.sort_unstable();
        preferred.dedup();
        Policy {
            max_batch_size: config.max_batch_size,
            max_queue_delay: Duration::from_micros(config.max_queue_delay_us),
            preferred_batch_sizes: if sequences { Vec::new() } else { preferred },
            max_batch_tokens: sequences.then_some(config.max_batch_tokens),
        }
    }
}

/// What the decision sees of one queued request. `key` groups requests that may share a batch (same data types
/// and non-batch dimensions); the queue is in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<K> {
    pub rows: usize,
    /// Text models: the sequence length of each of its rows (they are padded to it); 0 otherwise.
    pub seq_len: usize,
    pub key: K,
    pub enqueued_at: Instant,
}

/// Why a batch was cut where it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The next request would not fit under `max_batch_size` (or the batch is exactly full).
    MaxBatchSize,
    /// The next sequence would take the batch past `max_batch_tokens`.
    MaxBatchTokens,
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
        let group = match policy.max_batch_tokens {
            None => fill_rows(queue, first, policy),
            Some(budget) => fill_tokens(queue, first, policy.max_batch_size, budget),
        };
        let Group { mut positions, rows, full, preferred_cut } = group;
        if let Some(reason) = full {
            return Decision::Run { positions, rows, reason };
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

/// The batch one group could make now.
struct Group {
    /// Queue positions, ascending.
    positions: Vec<usize>,
    rows: usize,
    /// Why the batch cannot grow, when it cannot.
    full: Option<StopReason>,
    /// (positions taken, rows) at the largest preferred batch size reached.
    preferred_cut: Option<(usize, usize)>,
}

/// Takes the group of `queue[first]` whole requests at a time, in arrival order, up to `max_batch_size` rows.
fn fill_rows<K: PartialEq>(queue: &[Candidate<K>], first: usize, policy: &Policy) -> Group {
    let key = &queue[first].key;
    let mut group = Group { positions: Vec::new(), rows: 0, full: None, preferred_cut: None };
    for (i, c) in queue.iter().enumerate().skip(first).filter(|(_, c)| c.key == *key) {
        if group.rows + c.rows > policy.max_batch_size {
            group.full = Some(StopReason::MaxBatchSize);
            break;
        }
        group.rows += c.rows;
        group.positions.push(i);
        if policy.preferred_batch_sizes.binary_search(&group.rows).is_ok() {
            group.preferred_cut = Some((group.positions.len(), group.rows));
        }
        if group.rows == policy.max_batch_size {
            group.full = Some(StopReason::MaxBatchSize);
            break;
        }
    }
    group
}

/// Takes the oldest sequence of the group of `queue[first]`, then the others closest to its length first, while
/// the batch stays within `max_rows` rows, `budget` padded tokens and [`MAX_PADDING_WASTE`]. A sequence the
/// waste refuses waits for a batch of its own length; one the budget or the rows refuse makes the batch full.
fn fill_tokens<K: PartialEq>(queue: &[Candidate<K>], first: usize, max_rows: usize, budget: usize) -> Group {
    let head = &queue[first];
    let mut others: Vec<usize> = (first + 1..queue.len()).filter(|&i| queue[i].key == head.key).collect();
    // Closest length first; among equals, the oldest.
    others.sort_by_key(|&i| (queue[i].seq_len.abs_diff(head.seq_len), i));
    let mut group = Group { positions: vec![first], rows: head.rows, full: None, preferred_cut: None };
    let mut longest = head.seq_len;
    let mut real = head.rows * head.seq_len;
    for i in others {
        let c = &queue[i];
        let (rows, new_longest) = (group.rows + c.rows, longest.max(c.seq_len));
        let padded = rows.saturating_mul(new_longest);
        let new_real = real + c.rows * c.seq_len;
        if rows > max_rows {
            group.full = Some(StopReason::MaxBatchSize);
            break;
        }
        if padded > budget {
            // A longer sequence may not fit where a shorter one would; the batch is full only when nothing as
            // long as what it holds fits.
            if c.seq_len <= longest {
                group.full = Some(StopReason::MaxBatchTokens);
                break;
            }
            continue;
        }
        if padded as f64 > MAX_PADDING_WASTE * new_real as f64 {
            continue;
        }
        group.rows = rows;
        longest = new_longest;
        real = new_real;
        group.positions.push(i);
        if group.rows == max_rows {
            group.full = Some(StopReason::MaxBatchSize);
            break;
        }
    }
    group.positions.sort_unstable();
    group
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max: usize, delay_us: u64, preferred: &[usize]) -> Policy {
        Policy::from_config(
            &BatchingConfig {
                max_batch_size: max,
                max_queue_delay_us: delay_us,
                preferred_batch_sizes: preferred.to_vec(),
                ..BatchingConfig::default()
            },
            false,
        )
    }

    /// A queue from (rows, key, microseconds after t0) triples.
    fn queue(t0: Instant, items: &[(usize, u8, u64)]) -> Vec<Candidate<u8>> {
        items
            .iter()
            .map(|&(rows, key, at)| Candidate { rows, seq_len: 0, key, enqueued_at: t0 + Duration::from_micros(at) })
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

    fn text_policy(max_rows: usize, budget: usize, delay_us: u64) -> Policy {
        Policy::from_config(
            &BatchingConfig {
                max_batch_size: max_rows,
                max_batch_tokens: budget,
                max_queue_delay_us: delay_us,
                ..BatchingConfig::default()
            },
            true,
        )
    }

    /// One-row sequences of these lengths, arriving a microsecond apart.
    fn sequences(t0: Instant, lengths: &[usize]) -> Vec<Candidate<u8>> {
        lengths
            .iter()
            .enumerate()
            .map(|(i, &seq_len)| Candidate {
                rows: 1,
                seq_len,
                key: 0,
                enqueued_at: t0 + Duration::from_micros(i as u64),
            })
            .collect()
    }

    #[test]
    fn sequences_of_similar_length_batch_together_and_the_oldest_always_runs() {
        let t0 = Instant::now();
        // The oldest is 10 tokens: the 11 and 9 join it, the 40 and 100 would pad it past the waste bound.
        let q = sequences(t0, &[10, 40, 11, 100, 9]);
        assert_eq!(decide(&q, &text_policy(64, 16_384, 0), t0, false), run(&[0, 2, 4], 3, StopReason::WorkConserving));
        // Once they ran, the 40 is the oldest and runs alone: the 100 would pad it past the waste bound.
        let q = sequences(t0, &[40, 100]);
        assert_eq!(decide(&q, &text_policy(64, 16_384, 0), t0, false), run(&[0], 1, StopReason::WorkConserving));
    }

    #[test]
    fn the_token_budget_bounds_padded_rows_times_the_longest() {
        let t0 = Instant::now();
        let q = sequences(t0, &[100, 100, 100, 100]);
        // 3 × 100 fits in 350 tokens; a fourth does not, so the batch is full and need not wait.
        assert_eq!(decide(&q, &text_policy(64, 350, 1_000), t0, false), run(&[0, 1, 2], 3, StopReason::MaxBatchTokens));
        // Rows bound it too.
        assert_eq!(decide(&q, &text_policy(2, 16_384, 1_000), t0, false), run(&[0, 1], 2, StopReason::MaxBatchSize));
    }

    #[test]
    fn a_sequence_longer_than_the_budget_allows_does_not_fill_the_batch() {
        let t0 = Instant::now();
        // 20, 20 and 21 fit a budget of 70 padded tokens; the 90 does not fit beside them, yet the 21 after it does.
        let q = sequences(t0, &[20, 90, 20, 21]);
        assert_eq!(decide(&q, &text_policy(64, 70, 0), t0, false), run(&[0, 2, 3], 3, StopReason::WorkConserving));
    }

    #[test]
    fn text_batches_wait_for_their_delay_like_any_other() {
        let t0 = Instant::now();
        let q = sequences(t0, &[10, 10]);
        let p = text_policy(64, 16_384, 100);
        assert_eq!(decide(&q, &p, t0, false), Decision::WaitUntil(t0 + Duration::from_micros(100)));
        assert_eq!(decide(&q, &p, t0 + Duration::from_micros(100), false), run(&[0, 1], 2, StopReason::QueueDelay));
    }

    #[test]
    fn policy_sorts_and_dedups_preferred_sizes() {
        assert_eq!(policy(8, 0, &[4, 2, 4]).preferred_batch_sizes, vec![2, 4]);
    }
}
