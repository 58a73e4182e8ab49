//! The CPU threads candle's matrix products use.

/// Fixes the CPU thread count candle gives each matrix product, once. Unless `RAYON_NUM_THREADS` says it, candle
/// works the count out again on every product on the CPU (`candle_core::utils::get_num_threads`), and on a Linux
/// machine without preferred cores that is a read of `/proc/cpuinfo`, whose length grows with the cores: 48 reads a
/// MiniLM request, 7 % of its server CPU on two cores. rayon's process-wide pool, which reads the same variable, is
/// built first with the size it would have taken, so only candle's reads change, to the count they found before.
/// Call before any other thread starts (the environment is the process's); a count the operator set is left alone.
pub fn fix_cpu_threads() {
    const VARIABLE: &str = "RAYON_NUM_THREADS";
    if std::env::var_os(VARIABLE).is_some() {
        return;
    }
    let candle = candle_core::utils::get_num_threads();
    // Fails only where the pool exists already, when it took its size without the variable too.
    let _ = rayon::ThreadPoolBuilder::new().build_global();
    std::env::set_var(VARIABLE, candle.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// candle's count is the one it found before, now read from the variable; rayon's pool is the size it takes
    /// without the variable. (Nothing is asserted where the test's runner set the variable: then nothing changes.)
    #[test]
    fn candle_keeps_its_thread_count_and_rayon_its_pool() {
        if std::env::var_os("RAYON_NUM_THREADS").is_some() {
            return;
        }
        let found = candle_core::utils::get_num_threads();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        fix_cpu_threads();
        assert_eq!(std::env::var("RAYON_NUM_THREADS").as_deref(), Ok(found.to_string().as_str()));
        assert_eq!(candle_core::utils::get_num_threads(), found);
        assert_eq!(rayon::current_num_threads(), cores);
    }
}
