//! The error type of inferd-core, shared by the engines.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `model.toml` (or a file it names) is wrong; the message names the field.
    #[error("{}: {message}", path.display())]
    Config { path: PathBuf, message: String },
    /// A tensor does not fit what it must: the client's fault when it came from a request.
    #[error("{0}")]
    InvalidInput(String),
    /// A configuration this build or this machine cannot serve, refused at load time.
    #[error("{0}")]
    Unsupported(String),
    /// The engine failed to load or run a model.
    #[error("{0}")]
    Engine(String),
}

impl Error {
    pub fn config(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Config { path: path.into(), message: message.into() }
    }

    pub fn engine(message: impl std::fmt::Display) -> Self {
        Error::Engine(message.to_string())
    }
}
