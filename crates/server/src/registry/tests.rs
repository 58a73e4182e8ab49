//! The registry with fake engines: lookups, the start-up load, model control, and what readiness makes of the
//! states.

use std::sync::Arc;

use super::readiness::{assess, ReadinessPolicy, StallWatch, Status};
use super::*;
use crate::testing::{model_folder, registry};

const STRICT: ReadinessPolicy = ReadinessPolicy { strict: true, require_gpu: false };
const RELAXED: ReadinessPolicy = ReadinessPolicy { strict: false, require_gpu: false };

fn state_name(entry: &ModelEntry) -> String {
    match entry.state() {
        ModelState::Loading => "loading".into(),
        ModelState::Ready(_) => "ready".into(),
        ModelState::Failed(e) => format!("failed: {e}"),
        ModelState::Unloaded(e) => format!("unloaded: {e}"),
    }
}

#[test]
fn a_name_resolves_to_its_newest_ready_version_or_a_404_that_says_what_there_is() {
    let repo = tempfile::tempdir().expect("tempdir");
    model_folder(repo.path(), "a", "version_policy = \"all\"\n");
    for v in ["1", "2"] {
        std::fs::create_dir(repo.path().join("a").join(v)).expect("version folder");
    }
    model_folder(repo.path(), "b", "");
    let registry = registry(repo.path());
    assert_eq!(registry.names(|_| true), ["a", "b"]);
    assert_eq!(registry.versions("a"), [1, 2]);
    // Nothing is loaded yet: the newest version stands for the model.
    assert_eq!(registry.resolve("a", None).expect("a").version(), 2);
    registry.load_all(|| false);
    assert_eq!(registry.resolve("a", None).expect("a").version(), 2);
    assert_eq!(registry.resolve("a", Some(1)).expect("a/1").version(), 1);
    let missing = registry.resolve("nope", None).map(drop).expect_err("404");
    assert_eq!(missing.status(), axum::http::StatusCode::NOT_FOUND);
    assert_eq!(missing.message, "no model named `nope` (this server has `a`, `b`)");
    let version = registry.resolve("a", Some(3)).map(drop).expect_err("404");
    assert_eq!(version.message, "model `a` has no version 3 (it has [1, 2])");
    let entry = registry.resolve("b", None).expect("b");
    assert_eq!(entry.serving().expect("serving").name(), "b");
    assert_eq!(entry.counts().map(|c| c.requests.load(std::sync::atomic::Ordering::Relaxed)), Some(0));
}

#[test]
fn the_start_up_load_marks_each_model_ready_or_failed_and_stops_loading_at_shutdown() {
    let repo = tempfile::tempdir().expect("tempdir");
    model_folder(repo.path(), "good", "");
    model_folder(repo.path(), "broken", "");
    let registry = registry(repo.path());
    registry.load_all(|| false);
    let states: Vec<String> = registry.snapshot().iter().map(|m| state_name(m)).collect();
    assert_eq!(states, ["failed: this engine cannot load", "ready"]);
    let error = registry.resolve("broken", None).expect("found").serving().map(drop).expect_err("503");
    assert_eq!(error.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error.message, "model `broken` failed to load: this engine cannot load");

    let stopped = super::super::testing::registry(repo.path());
    stopped.load_all(|| true);
    let states: Vec<String> = stopped.snapshot().iter().map(|m| state_name(m)).collect();
    assert_eq!(states, vec!["failed: the server shut down before the model loaded"; 2]);
}

#[test]
fn readiness_waits_for_every_model_when_strict_and_for_one_when_relaxed() {
    let repo = tempfile::tempdir().expect("tempdir");
    model_folder(repo.path(), "good", "");
    model_folder(repo.path(), "broken", "");
    let registry = registry(repo.path());
    let stalls = StallWatch::new(None);
    let loading = assess(&registry.snapshot(), STRICT, false, &[], &stalls);
    assert_eq!((loading.status, loading.ready), (Status::Starting, false));
    assert_eq!(loading.reason.as_deref(), Some("model `broken` is still loading"));

    registry.load_all(|| false);
    let strict = assess(&registry.snapshot(), STRICT, false, &[], &stalls);
    assert_eq!((strict.status, strict.ready), (Status::Degraded, false));
    assert_eq!(strict.reason.as_deref(), Some("model `broken` failed to load: this engine cannot load"));
    let relaxed = assess(&registry.snapshot(), RELAXED, false, &[], &stalls);
    assert_eq!((relaxed.status, relaxed.ready), (Status::Degraded, true));
    let draining = assess(&registry.snapshot(), RELAXED, true, &[], &stalls);
    assert_eq!((draining.status, draining.ready), (Status::Draining, false));

    // A model that model control took out no longer counts.
    registry.unload("broken").expect("unloads");
    let healthy = assess(&registry.snapshot(), STRICT, false, &[], &stalls);
    assert_eq!(healthy, readiness::Assessment { status: Status::Healthy, reason: None, ready: true });
    let gpu = ReadinessPolicy { require_gpu: true, ..RELAXED };
    let no_gpu = assess(&registry.snapshot(), gpu, false, &[], &stalls);
    assert_eq!((no_gpu.status, no_gpu.ready), (Status::Degraded, false));
    assert_eq!(no_gpu.reason.as_deref(), Some("a GPU is required (--require-gpu), but none is visible"));
}

#[test]
fn model_control_loads_from_the_folder_and_unloads_without_touching_other_models() {
    let repo = tempfile::tempdir().expect("tempdir");
    model_folder(repo.path(), "a", "");
    let registry = registry(repo.path());
    registry.load_all(|| false);
    let resolved = registry.resolve("a", None).expect("a");
    let before = resolved.serving().expect("serving");

    model_folder(repo.path(), "late", "");
    assert_eq!(registry.unknown_folders(), ["late"]);
    assert_eq!(registry.load("late").expect("loads"), [1]);
    assert!(registry.unknown_folders().is_empty());
    assert_eq!(registry.load("a").expect("reloads"), [1]);
    let after = registry.resolve("a", None).expect("a").serving().expect("serving");
    assert!(!Arc::ptr_eq(&before, &after), "a reload serves new engines");
    // A request that resolved the model before the reload (its body still arriving, say) sees it was replaced.
    assert!(resolved.retired(), "the replaced entry is retired");
    assert!(!registry.resolve("a", None).expect("a").retired());

    registry.unload("a").expect("unloads");
    let error = registry.resolve("a", None).expect("still known").serving().map(drop).expect_err("503");
    assert_eq!(error.message, "model `a` is not loaded: unloaded");
    assert!(registry.resolve("late", None).expect("late").serving().is_ok());
    assert!(matches!(registry.load("nope"), Err(ControlError::NotFound(_))));
    assert!(matches!(registry.load("../a"), Err(ControlError::NotFound(_))));

    model_folder(repo.path(), "broken-later", "");
    let failed = registry.load("broken-later").map(drop).expect_err("cannot load");
    assert!(failed.to_string().contains("this engine cannot load"), "{failed}");
    let entry = registry.resolve("broken-later", None).expect("known now");
    assert!(state_name(&entry).starts_with("unloaded: the last load failed"), "{}", state_name(&entry));
}

#[test]
fn a_refresh_loads_what_changed_keeps_what_did_not_and_serves_on_through_a_failure() {
    let repo = tempfile::tempdir().expect("tempdir");
    model_folder(repo.path(), "a", "version_policy = \"all\"\n");
    let version = |v: &str| std::fs::create_dir_all(repo.path().join("a").join(v)).expect("version folder");
    version("1");
    let registry = registry(repo.path());
    registry.load_all(|| false);
    let one = registry.resolve("a", Some(1)).expect("a/1");

    // A new version: it loads; the unchanged one serves on, the same entry.
    version("2");
    registry.refresh("a", &|v| v == 2).expect("refreshes");
    assert!(Arc::ptr_eq(&one, &registry.resolve("a", Some(1)).expect("a/1")) && !one.retired());
    assert!(registry.resolve("a", Some(2)).expect("a/2").serving().is_ok());
    let two = registry.resolve("a", Some(2)).expect("a/2");

    // A version gone: unloaded, and retired, so requests that held it finish and later ones resolve again.
    std::fs::remove_dir(repo.path().join("a/1")).expect("removes");
    registry.refresh("a", &|v| v == 1).expect("refreshes");
    assert!(one.retired());
    let gone = registry.resolve("a", Some(1)).expect("still listed");
    assert!(state_name(&gone).starts_with("unloaded: its version folder left"), "{}", state_name(&gone));

    // A broken version: what served serves on; the broken one is unavailable with the reason.
    version("3");
    std::fs::write(repo.path().join("a/3/broken"), b"").expect("writes");
    let failed = registry.refresh("a", &|v| v == 3).expect_err("version 3 fails");
    assert!(failed.to_string().contains("model `a` version 3 failed to load: this engine cannot load"), "{failed}");
    assert!(Arc::ptr_eq(&two, &registry.resolve("a", None).expect("a")), "version 2 serves on");
    let three = registry.resolve("a", Some(3)).expect("listed");
    assert!(state_name(&three).starts_with("unloaded: model `a` version 3 failed to load"), "{}", state_name(&three));

    // Changed files of a serving version load anew; the folder gone unloads the model.
    std::fs::remove_file(repo.path().join("a/3/broken")).expect("removes");
    registry.refresh("a", &|v| v >= 2).expect("refreshes");
    assert!(two.retired() && registry.resolve("a", Some(3)).expect("a/3").serving().is_ok());
    std::fs::remove_dir_all(repo.path().join("a")).expect("removes");
    registry.refresh("a", &|_| true).expect("refreshes");
    assert!(registry.snapshot().iter().all(|m| m.loaded().is_none()));
}
