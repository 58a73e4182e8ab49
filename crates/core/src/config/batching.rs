//! `[batching]`: how a model's requests are grouped into batches, and the limits on batch sizes.

use serde::Deserialize;

/// Largest `max_batch_size` accepted: far beyond any useful batch, small enough to keep sizes in range.
pub const MAX_BATCH_SIZE_LIMIT: usize = 1 << 16;

/// `[batching]`: how requests are grouped and how much may wait.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BatchingConfig {
    /// Rows per batch at most. 0 (Triton's meaning): the model has no batch dimension, or no batching is wanted;
    /// each request's tensors run as they are sent, never joined with another's. A graph whose first dimension is
    /// a fixed number is served so whatever this says.
    pub max_batch_size: usize,
    /// Extra wait for a fuller batch; 0 runs whatever is queued as soon as a worker is free.
    pub max_queue_delay_us: u64,
    /// Batch sizes to cut at when the queue holds exactly enough rows for one.
    pub preferred_batch_sizes: Vec<usize>,
    /// Queued requests before new ones are refused (429).
    pub max_queue_size: usize,
    /// Queue deadline in milliseconds; 0 for none. A request may ask for less.
    pub timeout_ms: u64,
    /// Text models: padded tokens (rows × the longest sequence) per batch at most.
    pub max_batch_tokens: usize,
    /// A worker that has run no batch for this many milliseconds gives back the memory its engine keeps cached
    /// from its last batches (on a GPU, the blocks CUDA's memory pool holds for the next ones), once per idle
    /// spell; 0 keeps it for the next burst.
    pub release_after_idle_ms: u64,
    /// A lone request that finds a worker idle and nothing queued runs on the thread that took it in, with no
    /// hand-off to the worker thread and back, when it is expected to take under this many microseconds (from the
    /// model's recent batches, scaled to its rows; a CPU model only); 0 always hands off. At most
    /// [`MAX_RUN_INLINE_UNDER_US`].
    pub run_inline_under_us: u64,
}

/// Default `max_batch_tokens`: 16 Ki tokens, 64 rows of 256.
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 16 * 1024;

/// Default `run_inline_under_us`: a model whose batches take a few tens of microseconds (a small tabular or scoring
/// model) spends more on two threads' wake-ups than on its run.
pub const DEFAULT_RUN_INLINE_UNDER_US: u64 = 50;

/// Largest `run_inline_under_us`: the thread that runs a request inline serves other connections' requests too, and
/// a millisecond is as long as it may be kept from them.
pub const MAX_RUN_INLINE_UNDER_US: u64 = 1_000;

/// Default `release_after_idle_ms`: ten seconds, as long as the process's allocator keeps freed host pages.
pub const DEFAULT_RELEASE_AFTER_IDLE_MS: u64 = 10_000;

impl Default for BatchingConfig {
    fn default() -> Self {
        BatchingConfig {
            max_batch_size: 64,
            max_queue_delay_us: 0,
            preferred_batch_sizes: Vec::new(),
            max_queue_size: 1024,
            timeout_ms: 0,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
            release_after_idle_ms: DEFAULT_RELEASE_AFTER_IDLE_MS,
            run_inline_under_us: DEFAULT_RUN_INLINE_UNDER_US,
        }
    }
}
