//! A registered region's memory, mapped into the server so that an engine reads a request's inputs where the client
//! wrote them and the answer is copied once, straight into the client's memory.
//!
//! A page of a shared mapping past the end of its object raises SIGBUS when touched, so a client that shrinks its
//! object under a registered region would kill the server. The process's SIGBUS handler prevents that: it finds the
//! mapping the fault is in, maps zero pages of the server's own over the whole of it (the faulting access, and every
//! later one, then completes against those), and marks the mapping broken. The request that touched it fails, as
//! does every later one that names the region, until the client registers it again. A fault in no such mapping goes
//! to the handler that was there before (Rust's own, for stack overflows), or to the default action, as if this
//! handler were not there; a SIGBUS sent by another process ends this one, as SIGBUS does by default. Wayland
//! compositors guard their clients' shared-memory pools the same way.
//!
//! The handler reads the mappings from a fixed table without a lock (a signal handler may take none); each entry is a
//! sequence lock, changed only when a mapping is made or dropped.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Mappings at once: a registered region has one, kept while it is registered or a request holds it.
pub const MAX_MAPPINGS: usize = 1024;

/// A client's object (or a span of it) mapped read and write into the server.
#[derive(Debug)]
pub struct Mapping {
    /// Where the mapping starts: a page boundary at or before the region's first byte.
    base: NonNull<u8>,
    /// The mapping's bytes, from `base`.
    mapped: usize,
    /// The region's first byte, from `base`, and its bytes from there.
    start: usize,
    len: usize,
    /// Its entry in [`SLOTS`].
    slot: usize,
}

// SAFETY: the mapping is process memory that any thread may read and write; `Mapping` hands out no reference that
// outlives it, and unmaps it only when dropped.
unsafe impl Send for Mapping {}
// SAFETY: as above: every access through `&Mapping` is a read of the bytes, or a copy into them that the caller
// bounds (`write`), as with any shared memory.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` from `offset`, shared: what the server writes there the client sees.
    pub fn new(file: &std::fs::File, offset: u64, len: usize) -> io::Result<Mapping> {
        install_handler()?;
        let page = page_size();
        let start = (offset % page) as usize;
        let mapped = len.checked_add(start).filter(|&m| m > 0).ok_or_else(|| io::Error::other("too large to map"))?;
        let at = libc::off_t::try_from(offset - start as u64).map_err(|_| io::Error::other("offset too large"))?;
        // SAFETY: a new mapping at an address the kernel chooses, of an open file; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                at,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let claimed = NonNull::new(base.cast()).and_then(|mapping| Some((mapping, claim(base as usize, mapped)?)));
        let Some((mapping, slot)) = claimed else {
            // SAFETY: the mapping just made, which nothing has seen.
            unsafe { libc::munmap(base, mapped) };
            return Err(io::Error::other(format!("at most {MAX_MAPPINGS} shared memory regions are mapped at once")));
        };
        Ok(Mapping { base: mapping, mapped, start, len, slot })
    }

    /// The region's bytes. The client may change them while they are read: a client's requests must leave their
    /// regions alone until answered, as with Triton.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `start + len <= mapped` bytes from `base` stay mapped until `self` is dropped (replaced by zero
        // pages, if the client's object shrinks, never unmapped).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(self.start), self.len) }
    }

    /// Copies `bytes` into the region at `offset`: refused where they would run past its end.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> io::Result<()> {
        if offset.checked_add(bytes.len()).is_none_or(|end| end > self.len) {
            return Err(io::Error::other("past the end of the region"));
        }
        // SAFETY: within the mapping, checked above. `bytes` may be this very region (an input read in place that an
        // engine gave back as it is, to a span that overlaps it): `copy` allows for that.
        unsafe { std::ptr::copy(bytes.as_ptr(), self.base.as_ptr().add(self.start + offset), bytes.len()) };
        Ok(())
    }

    /// Whether every access so far reached the client's object: `false` once a fault found it shorter than the
    /// mapping, and for the rest of the mapping's life.
    pub fn intact(&self) -> bool {
        // The handler marks a mapping before it puts zero pages over it: whoever read or wrote those pages finds the
        // mark afterwards.
        !SLOTS[self.slot].broken.load(Ordering::SeqCst)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Out of the table first: a later mapping at the same addresses is not this one.
        let slot = &SLOTS[self.slot];
        slot.set(0, 0);
        // SAFETY: this mapping's own pages, which nothing refers to any more.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped) };
        slot.claimed.store(false, Ordering::Release);
    }
}

/// One mapping the handler knows of.
struct Slot {
    /// A sequence lock over `start` and `len`: odd while they change.
    seq: AtomicUsize,
    start: AtomicUsize,
    /// 0 where the slot holds no mapping.
    len: AtomicUsize,
    claimed: AtomicBool,
    broken: AtomicBool,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            seq: AtomicUsize::new(0),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            claimed: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        }
    }

    /// Sets the mapping's span; only by the slot's claimant.
    fn set(&self, start: usize, len: usize) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.start.store(start, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The mapping's span, if the slot holds one: what the handler reads.
    fn span(&self) -> Option<(usize, usize)> {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let (start, len) = (self.start.load(Ordering::Relaxed), self.len.load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return (len > 0).then_some((start, len));
            }
        }
    }
}

static SLOTS: [Slot; MAX_MAPPINGS] = [const { Slot::new() }; MAX_MAPPINGS];

/// The SIGBUS action before this module's, which faults outside every mapping go to.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Takes a free slot for a mapping of `len` bytes at `start`.
fn claim(start: usize, len: usize) -> Option<usize> {
    let index = SLOTS
        .iter()
        .position(|s| s.claimed.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok())?;
    let slot = &SLOTS[index];
    slot.broken.store(false, Ordering::SeqCst);
    slot.set(start, len);
    Some(index)
}

fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// Installs [`on_sigbus`] once for the process; the error, if it could not be.
fn install_handler() -> io::Result<()> {
    static INSTALLED: OnceLock<Option<i32>> = OnceLock::new();
    let failed = *INSTALLED.get_or_init(|| {
        // SAFETY: sigaction structures are plain data, for which all zeros is a valid (empty) value.
        let (mut action, mut previous): (libc::sigaction, libc::sigaction) = unsafe { std::mem::zeroed() };
        // The action before this one is kept before this one is installed, so that no fault finds it missing.
        // SAFETY: a sigaction structure of this frame, written by the call; the action is not changed.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) } != 0 {
            return io::Error::last_os_error().raw_os_error().or(Some(0));
        }
        let _ = PREVIOUS.set(previous);
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: both point to sigaction structures of this frame.
        if unsafe { libc::sigemptyset(&mut action.sa_mask) } != 0
            || unsafe { libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) } != 0
        {
            return io::Error::last_os_error().raw_os_error().or(Some(0));
        }
        None
    });
    match failed {
        None => Ok(()),
        Some(errno) => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// The SIGBUS handler: see the module's description. Async-signal-safe: atomics and system calls only.
extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, address) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // SAFETY: the calling thread's errno, which mmap may change and the interrupted code must find as it left it.
    let errno = unsafe { *libc::__errno_location() };
    // Only a fault the kernel raised (a code above 0) has an address to look up; a SIGBUS sent by `kill` does not.
    for slot in SLOTS.iter().filter(|_| code > 0) {
        let Some((start, len)) = slot.span() else { continue };
        if address < start || address - start >= len {
            continue;
        }
        // Marked first: a request that reads or writes the zero pages finds the mark when it asks (`intact`).
        slot.broken.store(true, Ordering::SeqCst);
        // SAFETY: replaces the pages of a mapping this module made, which stays in the table until unmapped, with
        // zero pages of the same length: every reference into it stays valid.
        let zeros = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if zeros != libc::MAP_FAILED {
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = errno };
            return;
        }
        // The mapping stays marked: it could not be mended, and the process ends below.
        break;
    }
    // Not a fault in a mapping of ours (or one that could not be mended): a fault goes to the handler that was there
    // before, as if this one were not; a SIGBUS that was sent ends the process, SIGBUS's default action.
    let previous =
        PREVIOUS.get().filter(|p| code > 0 && p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN);
    match previous {
        Some(p) if p.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: an SA_SIGINFO action's handler has this signature.
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(p.sa_sigaction) };
            handler(signal, info, context);
        }
        Some(p) => {
            // SAFETY: a plain action's handler has this signature.
            let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
            handler(signal);
        }
        None => {
            // The default action, which a fault meets again on return: the process ends as it would have. A signal
            // that was sent is raised again, to be delivered once this handler returns.
            // SAFETY: as in `install_handler`.
            let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
            default.sa_sigaction = libc::SIG_DFL;
            // SAFETY: a sigaction structure of this frame; `raise` is async-signal-safe.
            unsafe {
                libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
                if code <= 0 {
                    libc::raise(signal);
                }
            }
        }
    }
}
