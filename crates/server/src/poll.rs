//! Where the repository comes from, while serving: a remote one mirrored into the cache at start, and poll mode
//! (`--model-control poll`), which every `--poll-interval` mirrors a remote repository again, reads the folders'
//! stamps, and brings each model whose folder changed in line ([`crate::registry::Registry::refresh`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use inferd_models::{remote, FolderStamp, RemoteRepository};
use tokio::task::JoinHandle;

use crate::config::{object_store_options, ServeConfig};
use crate::state::AppState;

/// The repository folder to serve: `--models` itself, or, for a URL, the mirror of that remote repository once it
/// holds what the store holds (an error stops the start, with the reason).
pub async fn open(config: &ServeConfig) -> anyhow::Result<(PathBuf, Option<RemoteRepository>)> {
    let location = config.repository();
    let Some(url) = location.to_str().filter(|l| remote::is_remote(l)) else { return Ok((location, None)) };
    let options = object_store_options();
    let options = options.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let cache = config.remote.model_cache(url);
    let remote = RemoteRepository::open(url, options, cache.clone(), config.remote.limits())?;
    let started = std::time::Instant::now();
    let report = remote.sync().await?;
    tracing::info!(
        repository = url,
        cache = %cache.display(),
        files = report.files,
        bytes = report.bytes,
        downloaded_files = report.downloaded_files,
        downloaded_bytes = report.downloaded_bytes,
        removed = report.removed,
        skipped = report.skipped.len(),
        seconds = started.elapsed().as_secs_f64(),
        "mirrored the remote model repository"
    );
    Ok((remote.served()?, Some(remote)))
}

/// Mirrors a remote repository again, holding model control: what changed in the store since, if anything, is
/// logged. Where the store fails, nothing loads from the mirror (files that finished are kept for the next time),
/// and the error says why.
pub async fn mirror_again(state: &AppState) -> Result<(), String> {
    let Some(remote) = state.registry().remote() else { return Ok(()) };
    let report = remote.sync().await.map_err(|e| format!("cannot mirror {}: {e:#}", remote.url()))?;
    if report.downloaded_files + report.removed > 0 {
        tracing::info!(
            repository = remote.url(),
            downloaded = report.downloaded_files,
            removed = report.removed,
            bytes = report.downloaded_bytes,
            "mirrored the changes of the remote model repository"
        );
    }
    Ok(())
}

/// The repository's stamps now. Reads the folders: on the blocking pool.
pub async fn stamps(state: &AppState) -> anyhow::Result<BTreeMap<String, FolderStamp>> {
    let reader = state.clone();
    tokio::task::spawn_blocking(move || reader.registry().repository().stamps()).await.context("reading the stamps")
}

/// Starts poll mode: every `interval`, after the start-up load, until the server drains. `seen` is what the
/// start-up load read.
pub fn start(state: AppState, interval: Duration, mut seen: BTreeMap<String, FolderStamp>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if state.drain().is_draining() {
                return;
            }
            // Waits for the start-up load, and for any other change.
            let _control = state.registry().control().await;
            let problem = poll_once(&state, &mut seen).await.err();
            if let Some(problem) = &problem {
                tracing::warn!(problem = %problem, "poll: the repository is not all in line; what serves is unchanged");
            }
            state.registry().set_poll_problem(problem);
        }
    })
}

/// One reading: mirrors a remote repository, then refreshes each model whose stamp changed. What could not be
/// brought in line, if anything.
async fn poll_once(state: &AppState, seen: &mut BTreeMap<String, FolderStamp>) -> Result<(), String> {
    mirror_again(state).await?;
    let now = stamps(state).await.map_err(|e| format!("{e:#}"))?;
    let names: BTreeSet<String> = now.keys().chain(seen.keys()).cloned().collect();
    let mut problems = Vec::new();
    for name in names {
        let (stamp, before) = (now.get(&name).cloned(), seen.get(&name).cloned().unwrap_or_default());
        if stamp.as_ref() == seen.get(&name) {
            continue;
        }
        let worker = state.clone();
        let model = name.clone();
        let refreshed = tokio::task::spawn_blocking(move || {
            let changed = |version| stamp.as_ref().is_none_or(|s| s.changed(&before, version));
            worker.registry().refresh(&model, &changed)
        })
        .await;
        match refreshed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => problems.push(e.to_string()),
            Err(e) => problems.push(format!("model `{name}`: the load task failed: {e}")),
        }
        // A version that failed is tried again once its files change, not at every reading.
        match now.get(&name) {
            Some(stamp) => seen.insert(name, stamp.clone()),
            None => seen.remove(&name),
        };
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(problems.join("; ")),
    }
}
