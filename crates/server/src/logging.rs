//! The server's log on stderr, and Triton's logging extension: its settings read and changed while the server runs
//! (`/v2/logging`, gRPC's `LogSettings`). `--log` is the filter at start; `log_verbose_level` 1 adds inferd's debug
//! lines to it and 2 its trace lines; `log_info`, `log_warning` and `log_error` each let one severity through or stop
//! it; `log_format` switches between text (Triton's `default` and `ISO8601`: the timestamps are ISO 8601 either way)
//! and `json`. The file stays stderr, where a container's log is read.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::{Deserialize, Serialize};
use tracing::level_filters::LevelFilter;
use tracing::Level;
use tracing_log::{log, AsLog};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{filter, fmt, reload, EnvFilter, Layer, Registry};

use crate::config::LogFormat;
use crate::error::AppError;

/// The settings as Triton's logging extension names them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LogSettings {
    /// Always empty: the log goes to stderr.
    pub log_file: String,
    pub log_info: bool,
    pub log_warning: bool,
    pub log_error: bool,
    /// 0: the `--log` filter; 1: inferd's debug lines too; 2 and more: its trace lines too.
    pub log_verbose_level: u32,
    /// `default` or `ISO8601` (text), or `json`.
    pub log_format: String,
}

/// A change to some of the settings; the others stay.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LogUpdate {
    pub log_file: Option<String>,
    pub log_info: Option<bool>,
    pub log_warning: Option<bool>,
    pub log_error: Option<bool>,
    pub log_verbose_level: Option<u32>,
    pub log_format: Option<String>,
}

/// What the layers read on every line: which severities pass, and which format writes them.
#[derive(Debug)]
struct Switches {
    info: AtomicBool,
    warning: AtomicBool,
    error: AtomicBool,
    json: AtomicBool,
}

impl Switches {
    /// Whether the layer of format `json` (or text) takes a line or a span of `meta`'s: a line where it writes it, a
    /// span where that format is the one in use.
    fn takes(&self, meta: &tracing::Metadata<'_>, json: bool) -> bool {
        match meta.is_event() {
            true => self.writes(meta.level(), json),
            false => self.json.load(Ordering::Relaxed) == json,
        }
    }

    /// Whether a line of `level` in the `json` format (or text) is written.
    fn writes(&self, level: &Level, json: bool) -> bool {
        let on = match *level {
            Level::ERROR => self.error.load(Ordering::Relaxed),
            Level::WARN => self.warning.load(Ordering::Relaxed),
            Level::INFO => self.info.load(Ordering::Relaxed),
            _ => true,
        };
        on && self.json.load(Ordering::Relaxed) == json
    }
}

/// The log's settings and the handles that change it.
pub struct Logging {
    /// `--log`: the filter at verbose level 0.
    base: String,
    filter: Option<reload::Handle<EnvFilter, Registry>>,
    switches: Arc<Switches>,
    settings: Mutex<LogSettings>,
}

static LOGGING: OnceLock<Logging> = OnceLock::new();

/// Installs the process's log: `--log`'s filter, in `format`, on stderr. Once; later calls change nothing.
pub fn init(log: &str, format: LogFormat) {
    let base = match EnvFilter::try_new(log) {
        Ok(_) => log.to_owned(),
        Err(_) => "info".to_owned(),
    };
    let first = EnvFilter::new(&base);
    let most_verbose = first.max_level_hint();
    let (filter, handle) = reload::Layer::new(first);
    let logging = Logging::new(base, Some(handle), format);
    // Each format writes only the lines of its own format, and records only the spans begun while it is the one in
    // use: a span's fields are formatted when it begins, and formatting a request's span both ways cost 7,000
    // instructions a request. A line the other format writes inside a span begun before a switch goes without
    // that span's fields.
    let (text, json) = (logging.switches.clone(), logging.switches.clone());
    let text = fmt::layer()
        .with_writer(std::io::stderr)
        .with_thread_names(true)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter::dynamic_filter_fn(move |meta, _| text.takes(meta, false)));
    let json = fmt::layer()
        .json()
        .with_current_span(true)
        .with_span_list(true)
        .with_writer(std::io::stderr)
        .with_thread_names(true)
        .with_filter(filter::dynamic_filter_fn(move |meta, _| json.takes(meta, true)));
    if LOGGING.set(logging).is_ok() {
        let _ = tracing_subscriber::registry().with(filter).with(text).with(json).try_init();
        // After `try_init`, which installs the bridge from the `log` crate at the most verbose level.
        set_log_max_level(most_verbose);
    }
}

/// Lets the `log` crate's records through only as far as the filter can pass them (`max_level_hint`: its most
/// verbose directive). Libraries that log through it (the tokenizers library, at trace on every text it normalises)
/// are then refused by one comparison in the macro, where at `log`'s default, every level, each record crossed the
/// whole subscriber to reach the filter's refusal: half of tokenizing's CPU on two cores, and with many threads
/// tokenizing at once, much more (they all read the reloadable filter's lock).
fn set_log_max_level(most_verbose: Option<LevelFilter>) {
    log::set_max_level(most_verbose.unwrap_or(LevelFilter::TRACE).as_log());
}

/// The log's settings: the installed log's, or, where none was installed (a server in a test's process), settings
/// that change nothing.
pub fn logging() -> &'static Logging {
    LOGGING.get_or_init(|| Logging::new("info".to_owned(), None, LogFormat::Text))
}

impl Logging {
    fn new(base: String, filter: Option<reload::Handle<EnvFilter, Registry>>, format: LogFormat) -> Logging {
        let json = format == LogFormat::Json;
        Logging {
            base,
            filter,
            switches: Arc::new(Switches {
                info: AtomicBool::new(true),
                warning: AtomicBool::new(true),
                error: AtomicBool::new(true),
                json: AtomicBool::new(json),
            }),
            settings: Mutex::new(LogSettings {
                log_file: String::new(),
                log_info: true,
                log_warning: true,
                log_error: true,
                log_verbose_level: 0,
                log_format: if json { "json" } else { "default" }.to_owned(),
            }),
        }
    }

    pub fn settings(&self) -> LogSettings {
        self.settings.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Applies `update`, all of it or, where a value is refused, none of it. Returns the settings now.
    pub fn update(&self, update: LogUpdate) -> Result<LogSettings, AppError> {
        let mut settings = self.settings.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = settings.clone();
        if let Some(file) = update.log_file {
            if !file.is_empty() {
                return Err(AppError::bad_request(
                    "log_file must be empty: inferd logs to stderr, where the container's log is read",
                ));
            }
        }
        if let Some(format) = update.log_format {
            if !["default", "ISO8601", "json"].contains(&format.as_str()) {
                return Err(AppError::bad_request(format!(
                    "log_format `{}` is not one of default, ISO8601 (text) and json",
                    inferd_codec::quoted(&format)
                )));
            }
            next.log_format = format;
        }
        next.log_info = update.log_info.unwrap_or(next.log_info);
        next.log_warning = update.log_warning.unwrap_or(next.log_warning);
        next.log_error = update.log_error.unwrap_or(next.log_error);
        next.log_verbose_level = update.log_verbose_level.unwrap_or(next.log_verbose_level);
        if next.log_verbose_level != settings.log_verbose_level {
            if let Some(handle) = &self.filter {
                let filter = match next.log_verbose_level {
                    0 => EnvFilter::new(&self.base),
                    1 => EnvFilter::new(format!("{},inferd=debug", self.base)),
                    _ => EnvFilter::new(format!("{},inferd=trace", self.base)),
                };
                let most_verbose = filter.max_level_hint();
                handle.reload(filter).map_err(|e| AppError::internal(format!("changing the log filter: {e}")))?;
                set_log_max_level(most_verbose);
            }
        }
        let s = &self.switches;
        s.info.store(next.log_info, Ordering::Relaxed);
        s.warning.store(next.log_warning, Ordering::Relaxed);
        s.error.store(next.log_error, Ordering::Relaxed);
        s.json.store(next.log_format == "json", Ordering::Relaxed);
        *settings = next.clone();
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `log` crate's records pass its macros only as far as the filter lets lines through, at each verbose
    /// level: a library's trace records cost one comparison unless the filter could write them.
    #[test]
    fn log_crate_records_stop_where_the_filter_does() {
        let (_layer, handle) = reload::Layer::<EnvFilter, Registry>::new(EnvFilter::new("warn"));
        let logging = Logging::new("warn".to_owned(), Some(handle), LogFormat::Text);
        let verbose = |level| LogUpdate { log_verbose_level: Some(level), ..LogUpdate::default() };
        logging.update(verbose(2)).expect("verbose 2");
        assert_eq!(log::max_level(), log::LevelFilter::Trace);
        logging.update(verbose(1)).expect("verbose 1");
        assert_eq!(log::max_level(), log::LevelFilter::Debug);
        logging.update(verbose(0)).expect("verbose 0");
        assert_eq!(log::max_level(), log::LevelFilter::Warn);
        set_log_max_level(EnvFilter::new("off").max_level_hint());
        assert_eq!(log::max_level(), log::LevelFilter::Off);
    }
}
