//! The server's log on stderr, and Triton's logging extension: its settings read and changed while the server runs
//! (`/v2/logging`, gRPC's `LogSettings`). `--log` is the filter at start; `log_verbose_level` 1 adds inferd's debug
//! lines to it and 2 its trace lines; `log_info`, `log_warning` and `log_error` each let one severity through or stop
//! it; `log_format` switches between text (Triton's `default` and `ISO8601`: the timestamps are ISO 8601 either way)
//! and `json`. The file stays stderr, where a container's log is read.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::{Deserialize, Serialize};
use tracing::Level;
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
    let (filter, handle) = reload::Layer::new(EnvFilter::new(&base));
    let logging = Logging::new(base, Some(handle), format);
    // Both formats record every span's fields, so that either can write a line inside a span begun before a switch;
    // each writes only the lines of its own format.
    let (text, json) = (logging.switches.clone(), logging.switches.clone());
    let text = fmt::layer()
        .with_writer(std::io::stderr)
        .with_thread_names(true)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter::dynamic_filter_fn(move |meta, _| !meta.is_event() || text.writes(meta.level(), false)));
    let json = fmt::layer()
        .json()
        .with_current_span(true)
        .with_span_list(true)
        .with_writer(std::io::stderr)
        .with_thread_names(true)
        .with_filter(filter::dynamic_filter_fn(move |meta, _| !meta.is_event() || json.writes(meta.level(), true)));
    if LOGGING.set(logging).is_ok() {
        let _ = tracing_subscriber::registry().with(filter).with(text).with(json).try_init();
    }
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
                handle.reload(filter).map_err(|e| AppError::internal(format!("changing the log filter: {e}")))?;
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
