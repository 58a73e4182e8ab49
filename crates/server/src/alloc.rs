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
    /// jemalloc's option NAME (a NUL-terminated control name) as a `T`.
    fn option<T: Default>(name: &[u8]) -> T {
        let mut value = T::default();
        let mut len = std::mem::size_of::<T>();
        // SAFETY: NAME is NUL-terminated; jemalloc writes at most `len` bytes, the size of `value`, through the
        // pointer, and reads nothing.
        #[allow(unsafe_code)]
        let status = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr().cast(),
                (&mut value as *mut T).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(status, 0, "{}", String::from_utf8_lossy(name));
        value
    }

    /// The thread caches are the small ones `.cargo/config.toml` compiles in, collected as often as it says (unless
    /// MALLOC_CONF overrides them).
    #[test]
    fn thread_caches_are_small() {
        if std::env::var_os("MALLOC_CONF").is_some() {
            return;
        }
        assert_eq!(option::<u32>(b"opt.tcache_nslots_small_max\0"), 16);
        assert_eq!(option::<usize>(b"opt.tcache_max\0"), 8192);
        assert_eq!(option::<usize>(b"opt.tcache_gc_incr_bytes\0"), 1 << 20);
        assert_eq!(cached_at_most(8192), 2, "blocks above 4 KiB: two of each size");
        assert_eq!(cached_at_most(4097), 2);
        assert_eq!(cached_at_most(4096), 16, "smaller blocks as before");
    }

    /// How many free blocks of `size` bytes the calling thread's cache keeps at most.
    fn cached_at_most(size: usize) -> usize {
        let (mut size, mut value, mut len) = (size, 0usize, std::mem::size_of::<usize>());
        // SAFETY: the name is NUL-terminated; jemalloc reads a `usize` through the new pointer (the block size) and
        // writes at most `len` bytes, a `usize`, through the old one.
        #[allow(unsafe_code)]
        let status = unsafe {
            tikv_jemalloc_sys::mallctl(
                c"thread.tcache.ncached_max.read_sizeclass".as_ptr(),
                (&mut value as *mut usize).cast(),
                &mut len,
                (&mut size as *mut usize).cast(),
                std::mem::size_of::<usize>(),
            )
        };
        assert_eq!(status, 0, "ncached_max of {size}");
        value
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
