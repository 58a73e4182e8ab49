//! The process's allocator: jemalloc, for every allocation in the process. Rust's go to it as the global
//! allocator; ONNX Runtime's and the tokenizer's C and C++ ones too, since the binary exports jemalloc's unprefixed
//! `malloc` and `free`, which the dynamic linker binds before the C library's. It reuses what a batch freed for the
//! next batch, and a background thread gives pages back to the system once they have been idle for ten seconds,
//! where glibc's malloc kept a burst's peak for the life of the process (benches/README.md, "Memory").

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Gives every free page back to the system now, instead of over the next seconds: after a model loads, so that
/// its warm-up's scratch memory is not counted as what the model costs.
pub(crate) fn give_back_free_memory() {
    // `arena.<MALLCTL_ARENAS_ALL>.purge`
    command(c"arena.4096.purge", "purge");
}

/// Gives the calling thread's cached free blocks back to jemalloc's arenas, so that their pages can go back to
/// the system. For a thread that is going to wait a while: its next allocations refill the cache.
pub(crate) fn flush_thread_cache() {
    command(c"thread.tcache.flush", "flush the thread's cache");
}

/// Runs jemalloc's command `name` (a control that reads and writes nothing); a refusal is logged at debug, saying
/// what it did not `do_`.
fn command(name: &std::ffi::CStr, do_: &str) {
    // SAFETY: the name is a NUL-terminated control name that jemalloc defines; with null old and new pointers and
    // zero lengths, jemalloc neither reads nor writes through them.
    #[allow(unsafe_code)]
    let status = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if status != 0 {
        tracing::debug!(status, "jemalloc did not {do_}");
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    /// jemalloc's control `name` read as a `T`; `given` is written to it first, for a control that takes an
    /// argument (a block size, say).
    fn read<T: Default>(name: &CStr, given: Option<usize>) -> T {
        let mut value = T::default();
        let mut len = std::mem::size_of::<T>();
        let mut given = given;
        let (new, new_len) = match given.as_mut() {
            Some(given) => ((given as *mut usize).cast(), std::mem::size_of::<usize>()),
            None => (std::ptr::null_mut(), 0),
        };
        // SAFETY: the name is NUL-terminated; jemalloc writes at most `len` bytes, the size of `value`, through the
        // old pointer, and reads at most `new_len` bytes, a `usize` or nothing, through the new one.
        #[allow(unsafe_code)]
        let status =
            unsafe { tikv_jemalloc_sys::mallctl(name.as_ptr(), (&mut value as *mut T).cast(), &mut len, new, new_len) };
        assert_eq!(status, 0, "{name:?} {given:?}");
        value
    }

    /// How many free blocks of the given size the calling thread's cache keeps at most.
    const NCACHED_MAX: &CStr = c"thread.tcache.ncached_max.read_sizeclass";

    /// The thread caches are the small ones `.cargo/config.toml` compiles in, collected as often as it says (unless
    /// MALLOC_CONF overrides them).
    #[test]
    fn thread_caches_are_small() {
        if std::env::var_os("MALLOC_CONF").is_some() {
            return;
        }
        assert_eq!(read::<u32>(c"opt.tcache_nslots_small_max", None), 16);
        assert_eq!(read::<usize>(c"opt.tcache_max", None), 8192);
        assert_eq!(read::<usize>(c"opt.tcache_gc_incr_bytes", None), 1 << 20);
        assert_eq!(read::<usize>(NCACHED_MAX, Some(8192)), 2, "blocks above 4 KiB: two of each size");
        assert_eq!(read::<usize>(NCACHED_MAX, Some(4097)), 2);
        assert_eq!(read::<usize>(NCACHED_MAX, Some(4096)), 16, "smaller blocks as before");
    }

    /// A purge after freeing a large block: jemalloc accepts the command, and the block's pages leave the process.
    #[test]
    fn freed_memory_leaves_the_process_when_purged() {
        let resident = || crate::metrics::resident_memory_bytes().expect("VmRSS");
        let block = vec![1u8; 512 << 20];
        std::hint::black_box(&block);
        let with = resident();
        drop(block);
        super::give_back_free_memory();
        let without = resident();
        assert!(with.saturating_sub(without) > 384 << 20, "{with} -> {without}");
    }
}
