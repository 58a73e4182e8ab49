//! Triton's trace extension: which requests are traced, server-wide or per model (`/v2/trace/setting`,
//! `/v2/models/{model}/trace/setting`, gRPC's `TraceSetting`). A traced request's timings (preparing, queueing,
//! computing, in all) go to the structured log as one `inferd::trace` line; `TENSORS` adds its outputs' types and
//! shapes. Every `trace_rate`-th request of a model is traced, `trace_count` times in all (-1: no end).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::error::AppError;

/// One scope's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Settings {
    /// Empty: off. Else `TIMESTAMPS`, `TENSORS`, or both.
    levels: Vec<String>,
    rate: u64,
    /// Traces left: -1, no end.
    count: i64,
    log_frequency: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { levels: Vec::new(), rate: 1000, count: -1, log_frequency: 0 }
    }
}

/// What a traced request's line holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traced {
    /// Its outputs' types and shapes too.
    pub tensors: bool,
}

/// The settings that are not the server-wide ones, per model, and each model's count of requests.
#[derive(Default)]
struct Scopes {
    global: Settings,
    /// A model's own values, each `None` where it follows the server's.
    models: HashMap<String, ModelSettings>,
    /// Requests seen per model, for the rate: counted afresh when its settings change.
    seen: HashMap<String, u64>,
}

#[derive(Debug, Clone, Default)]
struct ModelSettings {
    levels: Option<Vec<String>>,
    rate: Option<u64>,
    count: Option<i64>,
    log_frequency: Option<u64>,
}

/// The trace settings of the server and its models.
#[derive(Default)]
pub struct Traces {
    scopes: Mutex<Scopes>,
    /// Whether any scope traces: when none does, requests pass without a lock.
    on: AtomicBool,
}

/// A setting to change: its name, and its new value (`None`: back to the server's, or the default).
pub type Change = (String, Option<Vec<String>>);

impl Traces {
    fn scopes(&self) -> std::sync::MutexGuard<'_, Scopes> {
        self.scopes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The settings of `model`, or the server's, as Triton lists them: names to lists of strings.
    pub fn settings(&self, model: Option<&str>) -> BTreeMap<&'static str, Vec<String>> {
        let scopes = self.scopes();
        let s = model.map_or_else(|| scopes.global.clone(), |m| scopes.effective(m));
        let one = |v: String| vec![v];
        BTreeMap::from([
            ("trace_file", one(String::new())),
            ("trace_level", if s.levels.is_empty() { one("OFF".into()) } else { s.levels }),
            ("trace_rate", one(s.rate.to_string())),
            ("trace_count", one(s.count.to_string())),
            ("log_frequency", one(s.log_frequency.to_string())),
            ("trace_mode", one("triton".into())),
        ])
    }

    /// Applies `changes` to `model`'s settings, or the server's: all of them, or, where one is refused, none.
    pub fn update(&self, model: Option<&str>, changes: Vec<Change>) -> Result<(), AppError> {
        let mut scopes = self.scopes();
        let mut global = scopes.global.clone();
        let mut own = model.map(|m| scopes.models.get(m).cloned().unwrap_or_default());
        for (name, value) in changes {
            let single = |value: &[String]| match value {
                [one] => Ok(one.clone()),
                _ => Err(AppError::bad_request(format!("trace setting `{name}` takes one value"))),
            };
            let number = |value: &[String], least: i64| {
                single(value)?.parse::<i64>().ok().filter(|&n| n >= least).ok_or_else(|| {
                    AppError::bad_request(format!("trace setting `{name}` must be a whole number, {least} or more"))
                })
            };
            match (name.as_str(), value) {
                ("trace_level", Some(levels)) => {
                    let levels = parse_levels(&levels)?;
                    match &mut own {
                        Some(own) => own.levels = Some(levels),
                        None => global.levels = levels,
                    }
                }
                ("trace_rate", Some(v)) => {
                    set(&mut own, &mut global, |o| &mut o.rate, |g| &mut g.rate, number(&v, 1)? as u64)
                }
                ("trace_count", Some(v)) => {
                    set(&mut own, &mut global, |o| &mut o.count, |g| &mut g.count, number(&v, -1)?)
                }
                ("log_frequency", Some(v)) => {
                    let n = number(&v, 0)? as u64;
                    set(&mut own, &mut global, |o| &mut o.log_frequency, |g| &mut g.log_frequency, n)
                }
                ("trace_level", None) => reset(&mut own, &mut global, |o| o.levels = None, |g| g.levels = Vec::new()),
                ("trace_rate", None) => reset(&mut own, &mut global, |o| o.rate = None, |g| g.rate = 1000),
                ("trace_count", None) => reset(&mut own, &mut global, |o| o.count = None, |g| g.count = -1),
                ("log_frequency", None) => {
                    reset(&mut own, &mut global, |o| o.log_frequency = None, |g| g.log_frequency = 0)
                }
                ("trace_file", value) => {
                    if value.is_some_and(|v| v.iter().any(|f| !f.is_empty())) {
                        return Err(AppError::bad_request(
                            "trace_file must be empty: inferd writes traces to its structured log (target \
                             inferd::trace)",
                        ));
                    }
                }
                ("trace_mode", value) => {
                    if value.is_some_and(|v| v.iter().any(|m| m != "triton")) {
                        return Err(AppError::bad_request(
                            "trace_mode must be `triton`: inferd has no OpenTelemetry mode",
                        ));
                    }
                }
                (other, _) => {
                    return Err(AppError::bad_request(format!(
                        "unknown trace setting `{}`: inferd takes trace_level, trace_rate, trace_count, log_frequency, \
                         trace_file and trace_mode",
                        inferd_codec::quoted(other)
                    )))
                }
            }
        }
        match (model, own) {
            (Some(model), Some(own)) => {
                scopes.models.insert(model.to_owned(), own);
                scopes.seen.remove(model);
            }
            _ => {
                scopes.global = global;
                scopes.seen.clear();
            }
        }
        let on = !scopes.global.levels.is_empty()
            || scopes.models.values().any(|m| m.levels.as_ref().is_some_and(|l| !l.is_empty()));
        self.on.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether this request of `model` is traced, and how; counts it toward the rate.
    pub fn sample(&self, model: &str) -> Option<Traced> {
        if !self.on.load(Ordering::Relaxed) {
            return None;
        }
        let mut scopes = self.scopes();
        let settings = scopes.effective(model);
        if settings.levels.is_empty() || settings.count == 0 {
            return None;
        }
        let seen = scopes.seen.entry(model.to_owned()).or_insert(0);
        *seen += 1;
        if !(*seen).is_multiple_of(settings.rate) {
            return None;
        }
        if settings.count > 0 {
            let left = settings.count - 1;
            match scopes.models.get_mut(model).filter(|m| m.count.is_some()) {
                Some(own) => own.count = Some(left),
                None => scopes.global.count = left,
            }
        }
        Some(Traced { tensors: settings.levels.iter().any(|l| l == "TENSORS") })
    }
}

impl Scopes {
    /// `model`'s settings: its own where it has them, the server's elsewhere.
    fn effective(&self, model: &str) -> Settings {
        let g = &self.global;
        match self.models.get(model) {
            None => g.clone(),
            Some(m) => Settings {
                levels: m.levels.clone().unwrap_or_else(|| g.levels.clone()),
                rate: m.rate.unwrap_or(g.rate),
                count: m.count.unwrap_or(g.count),
                log_frequency: m.log_frequency.unwrap_or(g.log_frequency),
            },
        }
    }
}

/// Sets one setting: the model's own where a model is named, else the server's.
fn set<T: Clone>(
    own: &mut Option<ModelSettings>,
    global: &mut Settings,
    of_model: impl FnOnce(&mut ModelSettings) -> &mut Option<T>,
    of_server: impl FnOnce(&mut Settings) -> &mut T,
    value: T,
) {
    match own {
        Some(own) => *of_model(own) = Some(value),
        None => *of_server(global) = value,
    }
}

/// Resets one setting: a model's to the server's, the server's to its default.
fn reset(
    own: &mut Option<ModelSettings>,
    global: &mut Settings,
    of_model: impl FnOnce(&mut ModelSettings),
    of_server: impl FnOnce(&mut Settings),
) {
    match own {
        Some(own) => of_model(own),
        None => of_server(global),
    }
}

/// Trace levels: `OFF` alone (none), or `TIMESTAMPS` and `TENSORS`.
fn parse_levels(levels: &[String]) -> Result<Vec<String>, AppError> {
    let mut chosen = Vec::new();
    for level in levels {
        match level.as_str() {
            "OFF" => {}
            "TIMESTAMPS" | "TENSORS" if !chosen.contains(level) => chosen.push(level.clone()),
            "TIMESTAMPS" | "TENSORS" => {}
            other => {
                return Err(AppError::bad_request(format!(
                    "trace level `{}` is not one of OFF, TIMESTAMPS and TENSORS",
                    inferd_codec::quoted(other)
                )))
            }
        }
    }
    if levels.iter().any(|l| l == "OFF") && !chosen.is_empty() {
        return Err(AppError::bad_request("trace level OFF cannot come with TIMESTAMPS or TENSORS"));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(name: &str, value: Option<&[&str]>) -> Change {
        (name.to_owned(), value.map(|v| v.iter().map(|s| (*s).to_owned()).collect()))
    }

    #[test]
    fn a_model_follows_the_server_except_where_it_has_its_own_values() {
        let traces = Traces::default();
        assert_eq!(traces.sample("m"), None, "off by default");
        assert_eq!(traces.settings(None)["trace_level"], ["OFF"]);
        traces
            .update(None, vec![change("trace_level", Some(&["TIMESTAMPS"])), change("trace_rate", Some(&["2"]))])
            .expect("valid settings");
        let traced: Vec<bool> = (0..4).map(|_| traces.sample("m").is_some()).collect();
        assert_eq!(traced, [false, true, false, true], "every second request");
        traces
            .update(Some("m"), vec![change("trace_rate", Some(&["1"])), change("trace_count", Some(&["2"]))])
            .expect("valid settings");
        assert_eq!(traces.settings(Some("m"))["trace_rate"], ["1"]);
        assert_eq!(traces.settings(None)["trace_rate"], ["2"], "the server's own stays");
        let traced: Vec<bool> = (0..3).map(|_| traces.sample("m").is_some()).collect();
        assert_eq!(traced, [true, true, false], "two traces, then none");
        assert_eq!(traces.settings(Some("m"))["trace_count"], ["0"]);
        traces
            .update(Some("m"), vec![change("trace_count", None), change("trace_rate", None)])
            .expect("valid settings");
        assert_eq!(traces.settings(Some("m"))["trace_count"], ["-1"], "back to the server's");
        traces.update(None, vec![change("trace_level", Some(&["OFF"]))]).expect("valid settings");
        assert_eq!(traces.sample("m"), None);
        assert!(!traces.on.load(Ordering::Relaxed));
    }

    #[test]
    fn bad_values_change_nothing() {
        let traces = Traces::default();
        for (name, value) in [
            ("trace_level", &["LOUD"][..]),
            ("trace_level", &["OFF", "TENSORS"][..]),
            ("trace_rate", &["0"][..]),
            ("trace_count", &["-2"][..]),
            ("trace_rate", &["1", "2"][..]),
            ("trace_file", &["/tmp/trace.json"][..]),
            ("trace_mode", &["opentelemetry"][..]),
            ("trace_colour", &["red"][..]),
        ] {
            let e = traces
                .update(None, vec![change("trace_level", Some(&["TENSORS"])), change(name, Some(value))])
                .expect_err("refused");
            assert_eq!(e.status(), 400, "{name}: {}", e.message);
        }
        assert_eq!(traces.settings(None)["trace_level"], ["OFF"], "nothing applied");
    }
}
