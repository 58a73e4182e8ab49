//! A busy model's wide session. A graph that stores narrow weights (int8 or fp16 that a `Cast` widens, see
//! [`crate::graph`]) serves from a session that keeps them narrow and widens them on every batch: small at rest,
//! a few per cent slower a batch (benches/README.md, "Narrow lookup tables"). Once its model has been busy for a
//! while, a second session that widened them once as it loaded (constant folding) takes the batches: built on a
//! thread of its own, so that no batch waits for it, and only where the host has the room. It is dropped when the
//! model goes idle ([`inferd_core::Engine::release_cached_memory`]), as a burst's working memory is: the model
//! costs its narrow weights at rest and runs at the wide speed under load.

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use inferd_core::{Error, HostMemory, Result};
use ort::session::Session;

/// A batch that starts within this long of the last one's end continues the model's busy spell.
pub(crate) const BACK_TO_BACK: Duration = Duration::from_millis(50);
/// How long a busy spell lasts before the wide session is built: long enough that a lone request or a short
/// burst never pays for it.
pub(crate) const BUSY_FOR: Duration = Duration::from_secs(1);
/// The wide session is built only where the host has this many times the narrow weights' bytes available: widened
/// to FP32 (up to 4x), and twice that while ONNX Runtime folds and packs them.
pub(crate) const ROOM_PER_NARROW_BYTE: u64 = 8;
/// A model refused for want of room asks again after this long, if it is still busy.
pub(crate) const ROOM_RETRY: Duration = Duration::from_secs(10);

/// Set while some model's wide session is being built: one at a time in the process, so that the room each build
/// reads is not promised to another at once (a burst reaches every instance and model together).
static BUILDING: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));

/// The host memory available, in bytes; `None` where it cannot be read.
pub(crate) type RoomReader = fn() -> Option<u64>;

fn host_room() -> Option<u64> {
    HostMemory::read().map(|host| host.available)
}

/// The model file as it loaded, held open: the wide session is built from the same bytes even where the file has
/// since been removed or renamed over, and not at all where it was written over in place.
pub(crate) struct HeldFile {
    file: File,
    fingerprint: (u64, u64),
}

impl HeldFile {
    /// `file`, whose content is `bytes`.
    pub(crate) fn new(file: File, bytes: &[u8]) -> HeldFile {
        HeldFile { file, fingerprint: fingerprint(bytes) }
    }

    /// The file's bytes, if they are still those it loaded with.
    pub(crate) fn bytes(&self) -> Result<Vec<u8>> {
        let changed = || Error::Engine("the model file changed after it loaded".into());
        let len = usize::try_from(self.fingerprint.0).map_err(|_| changed())?;
        if self.file.metadata().map_err(Error::engine)?.len() != self.fingerprint.0 {
            return Err(changed());
        }
        let mut bytes = vec![0; len];
        self.file.read_exact_at(&mut bytes, 0).map_err(Error::engine)?;
        match fingerprint(&bytes) == self.fingerprint {
            true => Ok(bytes),
            false => Err(changed()),
        }
    }
}

fn fingerprint(bytes: &[u8]) -> (u64, u64) {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    (bytes.len() as u64, hasher.finish())
}

/// Opens the wide session.
pub(crate) type OpenWide = Arc<dyn Fn() -> Result<Session> + Send + Sync>;

/// A model's wide session, and the busy spell that calls for it.
pub(crate) struct Busy {
    open: OpenWide,
    model: String,
    narrow_bytes: u64,
    /// [`BUSY_FOR`], the process's build flag and the host's room, but for tests.
    pub(crate) busy_for: Duration,
    pub(crate) building: Arc<AtomicBool>,
    pub(crate) room: RoomReader,
    /// When the current busy spell began, and when its last batch ended.
    spell: Option<(Instant, Instant)>,
    wide: Wide,
}

enum Wide {
    None,
    Building(JoinHandle<Result<Session>>),
    Ready(Session),
    /// The host had no room for it at this time: asked again [`ROOM_RETRY`] later.
    NoRoom(Instant),
    /// It could not be built: never tried again.
    Failed,
}

impl Busy {
    pub(crate) fn new(model: &str, narrow_bytes: u64, open: OpenWide) -> Busy {
        Busy {
            open,
            model: model.to_owned(),
            narrow_bytes,
            busy_for: BUSY_FOR,
            building: Arc::clone(&BUILDING),
            room: host_room,
            spell: None,
            wide: Wide::None,
        }
    }

    /// Before a batch: counts it into the busy spell, starts building the wide session once the spell is long
    /// enough, and returns the wide session once it is built.
    pub(crate) fn before_batch(&mut self) -> Option<&mut Session> {
        self.before_batch_at(Instant::now())
    }

    fn before_batch_at(&mut self, now: Instant) -> Option<&mut Session> {
        let since = match self.spell {
            Some((since, end)) if now.saturating_duration_since(end) <= BACK_TO_BACK => since,
            _ => now,
        };
        self.spell = Some((since, now));
        match &self.wide {
            Wide::Building(handle) if handle.is_finished() => self.finish_building(),
            Wide::NoRoom(at) if now.saturating_duration_since(*at) >= ROOM_RETRY => self.wide = Wide::None,
            _ => {}
        }
        if matches!(self.wide, Wide::None) && now.saturating_duration_since(since) >= self.busy_for {
            self.start_building(now);
        }
        match &mut self.wide {
            Wide::Ready(session) => Some(session),
            _ => None,
        }
    }

    /// After a batch, whatever its outcome.
    pub(crate) fn after_batch(&mut self) {
        self.after_batch_at(Instant::now());
    }

    fn after_batch_at(&mut self, now: Instant) {
        if let Some((since, _)) = self.spell {
            self.spell = Some((since, now));
        }
    }

    /// The model went idle: the wide session goes (a build under way is waited for, then dropped).
    pub(crate) fn release(&mut self) {
        self.spell = None;
        match std::mem::replace(&mut self.wide, Wide::None) {
            Wide::Building(handle) => drop(handle.join()),
            Wide::Ready(session) => {
                drop(session);
                tracing::info!(model = %self.model, "idle: the session with widened weights is dropped");
            }
            Wide::Failed => self.wide = Wide::Failed,
            Wide::None | Wide::NoRoom(_) => {}
        }
    }

    /// Whether the wide session serves the batches now.
    #[cfg(test)]
    pub(crate) fn is_wide(&self) -> bool {
        matches!(self.wide, Wide::Ready(_))
    }

    /// Whether building the wide session failed, never to be tried again.
    #[cfg(test)]
    pub(crate) fn has_failed(&self) -> bool {
        matches!(self.wide, Wide::Failed)
    }

    fn start_building(&mut self, now: Instant) {
        // Another build under way: this one waits for a later batch.
        if self.building.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return;
        }
        let done = Done(Arc::clone(&self.building));
        let needed = self.narrow_bytes.saturating_mul(ROOM_PER_NARROW_BYTE);
        if let Some(available) = (self.room)().filter(|&available| available < needed) {
            tracing::info!(
                model = %self.model,
                needed_bytes = needed,
                available_bytes = available,
                "busy, but the host has no room to widen the narrow weights: batches keep widening them as they run"
            );
            self.wide = Wide::NoRoom(now);
            return;
        }
        tracing::info!(model = %self.model, "busy: building a session with the narrow weights widened once");
        let open = Arc::clone(&self.open);
        let build = move || {
            let _done = done;
            open()
        };
        self.wide = match std::thread::Builder::new().name("inferd-widen".into()).spawn(build) {
            Ok(handle) => Wide::Building(handle),
            Err(e) => {
                tracing::warn!(model = %self.model, error = %e, "cannot start a thread to widen the narrow weights");
                Wide::Failed
            }
        };
    }

    fn finish_building(&mut self) {
        let Wide::Building(handle) = std::mem::replace(&mut self.wide, Wide::None) else { return };
        self.wide = match handle.join() {
            Ok(Ok(session)) => {
                tracing::info!(model = %self.model, "the session with widened weights serves until the model is idle");
                Wide::Ready(session)
            }
            Ok(Err(e)) => {
                tracing::warn!(model = %self.model, error = %e, "cannot widen the narrow weights: batches keep widening them");
                Wide::Failed
            }
            Err(_) => {
                tracing::warn!(model = %self.model, "widening the narrow weights panicked: batches keep widening them");
                Wide::Failed
            }
        };
    }
}

impl Drop for Busy {
    /// An engine dropped (its model unloaded or replaced) while its wide session is built waits for the build, so
    /// that the memory is back before a model loads in its place.
    fn drop(&mut self) {
        if let Wide::Building(handle) = std::mem::replace(&mut self.wide, Wide::None) {
            drop(handle.join());
        }
    }
}

/// Clears the process's build flag when a build ends, however it ends.
struct Done(Arc<AtomicBool>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A `Busy` whose wide session never builds, with a build flag of its own and room enough; how many times it
    /// was asked to build; and a flag that holds each build until it is set.
    fn failing_held() -> (Busy, Arc<AtomicUsize>, Arc<AtomicBool>) {
        let (builds, proceed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(true)));
        let (counted, go) = (Arc::clone(&builds), Arc::clone(&proceed));
        let open: OpenWide = Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            while !go.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            Err(Error::Engine("no session in this test".into()))
        });
        let mut busy = Busy::new("test", 1, open);
        busy.building = Arc::new(AtomicBool::new(false));
        busy.room = || Some(1 << 40);
        (busy, builds, proceed)
    }

    fn failing() -> (Busy, Arc<AtomicUsize>) {
        let (busy, builds, _) = failing_held();
        (busy, builds)
    }

    fn wait_for_the_build(busy: &Busy) {
        while matches!(&busy.wide, Wide::Building(handle) if !handle.is_finished()) {
            std::thread::yield_now();
        }
    }

    /// A batch from `start` to `end` milliseconds after `base`.
    fn batch(busy: &mut Busy, base: Instant, start: u64, end: u64) {
        let at = |ms: u64| base + Duration::from_millis(ms);
        assert!(busy.before_batch_at(at(start)).is_none());
        busy.after_batch_at(at(end));
    }

    #[test]
    fn the_wide_session_is_asked_for_once_batches_have_run_back_to_back_for_busy_for() {
        let (mut busy, builds) = failing();
        let base = Instant::now();
        let gap = BACK_TO_BACK.as_millis() as u64;
        let busy_for = BUSY_FOR.as_millis() as u64;
        // Back to back for less than BUSY_FOR, then a pause one millisecond too long: the spell starts again.
        batch(&mut busy, base, 0, 400);
        batch(&mut busy, base, 400 + gap, busy_for - 10);
        batch(&mut busy, base, busy_for - 10 + gap + 1, 2 * busy_for);
        assert!(matches!(busy.wide, Wide::None), "two spells, each shorter than BUSY_FOR at its batches' starts");
        // The new spell reaches BUSY_FOR at its next batch.
        let next = 2 * busy_for + gap;
        batch(&mut busy, base, next, next + 10);
        assert!(matches!(busy.wide, Wide::Building(_)), "asked for at the batch that starts BUSY_FOR into the spell");
        wait_for_the_build(&busy);
        // The failure is found at the next batch, and nothing asks again: not more load, not an idle spell.
        batch(&mut busy, base, next + 20, next + 30);
        assert!(matches!(busy.wide, Wide::Failed));
        busy.release();
        batch(&mut busy, base, 10 * busy_for, 12 * busy_for);
        batch(&mut busy, base, 12 * busy_for, 14 * busy_for);
        assert!(matches!(busy.wide, Wide::Failed));
        assert_eq!(builds.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_idle_model_starts_its_busy_spell_anew() {
        let (mut busy, builds) = failing();
        let base = Instant::now();
        let busy_for = BUSY_FOR.as_millis() as u64;
        batch(&mut busy, base, 0, busy_for - 1);
        busy.release();
        // Back to back with the batch before the release, but the release ended that spell.
        batch(&mut busy, base, busy_for, busy_for + 1);
        assert!(matches!(busy.wide, Wide::None));
        assert_eq!(builds.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn one_build_at_a_time_in_the_process_and_none_without_room() {
        let (mut busy, builds, proceed) = failing_held();
        let base = Instant::now();
        let busy_for = BUSY_FOR.as_millis() as u64;
        proceed.store(false, Ordering::SeqCst);
        // Another model's build under way: this one waits, and asks at a later batch once it is over.
        busy.building.store(true, Ordering::SeqCst);
        batch(&mut busy, base, 0, busy_for);
        batch(&mut busy, base, busy_for, busy_for + 10);
        assert!(matches!(busy.wide, Wide::None));
        busy.building.store(false, Ordering::SeqCst);
        batch(&mut busy, base, busy_for + 10, busy_for + 20);
        assert!(matches!(busy.wide, Wide::Building(_)));
        assert!(busy.building.load(Ordering::SeqCst), "the flag is held while it builds");
        // Released while it builds: the build is waited for, and its flag cleared.
        proceed.store(true, Ordering::SeqCst);
        busy.release();
        assert!(matches!(busy.wide, Wide::None));
        assert!(!busy.building.load(Ordering::SeqCst));
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        // No room: nothing built, and asked again ROOM_RETRY later if still busy.
        busy.room = || Some(7);
        let start = 10 * busy_for;
        batch(&mut busy, base, start, start + busy_for);
        batch(&mut busy, base, start + busy_for, start + busy_for + 10);
        assert!(matches!(busy.wide, Wide::NoRoom(_)));
        assert!(!busy.building.load(Ordering::SeqCst));
        busy.room = || Some(1 << 40);
        let retry = ROOM_RETRY.as_millis() as u64;
        batch(&mut busy, base, start + busy_for + 20, start + busy_for + retry);
        assert!(matches!(busy.wide, Wide::NoRoom(_)), "not before ROOM_RETRY");
        batch(&mut busy, base, start + busy_for + retry + 10, start + busy_for + retry + 20);
        assert!(matches!(busy.wide, Wide::Building(_)), "asked again ROOM_RETRY later");
        wait_for_the_build(&busy);
        assert_eq!(builds.load(Ordering::SeqCst), 2);
    }
}
