//! A worker over time: the batch it reports running until it ends, and, left idle after its batches, its engine
//! giving back what it keeps cached: once per idle spell, never before a batch has run (the load released what the
//! warm-up left), never with `release_after_idle_ms = 0`. What is checked not to happen is checked after many
//! times the idle period, so a slow machine cannot fail it.

use super::*;

fn releases(gate: &Gate) -> mpsc::UnboundedReceiver<()> {
    let (tx, rx) = mpsc::unbounded_channel();
    *gate.released.lock().expect("gate") = Some(tx);
    rx
}

/// Waits for the next release, for at most ten seconds.
async fn next_release(rx: &mut mpsc::UnboundedReceiver<()>) {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the idle worker released its engine's cached memory")
        .expect("the gate lives as long as the fixture");
}

#[tokio::test]
async fn an_idle_worker_releases_its_engines_cached_memory_once_per_idle_spell() {
    let f = fixture(BatchingConfig { release_after_idle_ms: 20, ..batched(8) }, true);
    let mut released = releases(&f.gate);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(released.try_recv().is_err(), "released before any batch ran");

    f.batcher.infer(rows(&[1.0], 1)).await.expect("answered");
    next_release(&mut released).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(released.try_recv().is_err(), "released again with no batch in between");

    // A batch after the release: served as before, and the next idle spell releases again.
    let answer = f.batcher.infer(rows(&[3.0], 1)).await.expect("answered after a release");
    assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), vec![6.0]);
    next_release(&mut released).await;
    // The observer hears of each idle spell on the worker's own thread, after its engine's release.
    let told = async {
        loop {
            let idle = f.observed.idle.lock().expect("observed").clone();
            if idle.len() >= 2 {
                return idle;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let idle = tokio::time::timeout(Duration::from_secs(10), told).await.expect("the observer heard of both");
    assert_eq!(idle, vec!["inferd-double-0".to_owned(); 2]);
}

#[tokio::test]
async fn nothing_is_released_before_the_idle_period_has_passed() {
    assert_no_release_after_a_batch(60_000, "released a minute early").await;
}

#[tokio::test]
async fn zero_keeps_the_cached_memory() {
    assert_no_release_after_a_batch(0, "released with release_after_idle_ms = 0").await;
}

/// With `release_after_idle_ms`, one batch and then 300 ms of idleness release nothing.
async fn assert_no_release_after_a_batch(release_after_idle_ms: u64, why: &str) {
    let f = fixture(BatchingConfig { release_after_idle_ms, ..batched(8) }, true);
    let mut released = releases(&f.gate);
    f.batcher.infer(rows(&[1.0], 1)).await.expect("answered");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(released.try_recv().is_err(), "{why}");
}

#[tokio::test]
async fn a_long_running_batch_is_reported_until_it_ends() {
    let f = fixture(batched(8), false);
    assert_eq!(f.batcher.longest_running(), None, "idle");
    let running = hold_worker(&f, 0.0).await;
    let first = f.batcher.longest_running().expect("a batch runs");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(f.batcher.longest_running().expect("still running") >= first + Duration::from_millis(20));
    f.gate.open();
    running.await.expect("task").expect("answered");
    // The worker clears its mark before it waits for the next batch.
    for _ in 0..100 {
        if f.batcher.longest_running().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the finished batch is still reported as running");
}
