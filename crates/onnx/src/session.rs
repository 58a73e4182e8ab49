//! The ONNX Runtime environment (the library, loaded once, and the thread pool its sessions share) and the sessions
//! opened in it: execution providers, threads, constant folding, and the model's bytes as stored or rewritten.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use inferd_core::{Error, ModelConfig, Precision, Result};
use ort::environment::{Environment, GlobalThreadPoolOptions};
use ort::ep;
use ort::session::Session;

use crate::graph;

/// The one ONNX Runtime environment of this process, once a library loaded. A failed load is not remembered:
/// a later model may name a library that exists.
static RUNTIME: OnceLock<Runtime> = OnceLock::new();
/// Serialises first loads.
static LOADING: Mutex<()> = Mutex::new(());

pub(crate) struct Runtime {
    pub(crate) environment: Environment,
    pub(crate) library: PathBuf,
}

/// Loads the ONNX Runtime library (once per process) and returns its environment, whose global thread pool of
/// `threads` the sessions share.
pub(crate) fn runtime(library: &Path, threads: usize) -> Result<&'static Runtime> {
    if let Some(runtime) = RUNTIME.get() {
        return Ok(loaded(runtime, library));
    }
    let _loading = LOADING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(runtime) = RUNTIME.get() {
        return Ok(loaded(runtime, library));
    }
    if !library.is_file() {
        return Err(Error::Engine(format!(
            "the ONNX Runtime library is not at {}: run ./scripts/setup.sh (it fetches libonnxruntime.so.1.31.1 from \
             the onnxruntime wheel on PyPI), or point --onnxruntime-lib / INFERD_ONNXRUNTIME_LIB at a \
             libonnxruntime.so of version 1.31 or newer",
            library.display()
        )));
    }
    let builder = ort::init_from(library)
        .map_err(|e| Error::Engine(format!("cannot load the ONNX Runtime library {}: {e}", library.display())))?;
    // The pool's threads sleep when there is no work: spinning would take the cores from the runtime's threads
    // and the other models (see `open_session`).
    let pool = GlobalThreadPoolOptions::default()
        .with_intra_threads(threads.max(1))
        .and_then(|p| p.with_inter_threads(1))
        .and_then(|p| p.with_spin_control(false))
        .map_err(|e| Error::Engine(format!("cannot set up ONNX Runtime's thread pool: {e}")))?;
    let environment = builder
        .with_name("inferd")
        .with_global_thread_pool(pool)
        .build()
        .map_err(|e| Error::Engine(format!("cannot start ONNX Runtime from {}: {e}", library.display())))?;
    tracing::info!(library = %library.display(), shared_threads = threads, "ONNX Runtime loaded");
    Ok(RUNTIME.get_or_init(|| Runtime { environment, library: library.to_path_buf() }))
}

fn loaded<'a>(runtime: &'a Runtime, asked: &Path) -> &'a Runtime {
    if runtime.library != asked {
        tracing::warn!(
            loaded = %runtime.library.display(),
            asked = %asked.display(),
            "ONNX Runtime is loaded once per process; keeping the library loaded first"
        );
    }
    runtime
}

/// Which execution providers a session gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    Cpu,
    /// GPU `n` through TensorRT (when asked) and CUDA; loading fails if they cannot be registered.
    Gpu {
        device: usize,
        required: bool,
    },
}

pub(crate) fn tensorrt_fp16(config: &ModelConfig, default_precision: Precision) -> bool {
    config.onnx.tensorrt
        && (config.onnx.tensorrt_fp16 || config.precision.unwrap_or(default_precision) == Precision::Fp16)
}

/// Whether a session folds constants: as `[onnx] fold_constants` says, else unless the graph stores weights that a
/// `Cast` widens (see [`graph`]).
pub(crate) fn fold_constants(config: &ModelConfig, stored: Option<graph::Stored>) -> bool {
    let widened = stored.map_or(0, |s| s.widened_bytes);
    config.onnx.fold_constants.unwrap_or_else(|| {
        if widened > 0 {
            tracing::info!(
                model = %config.name,
                narrow_weight_bytes = widened,
                "the graph stores weights narrower than it computes with them: constant folding is off, so that \
                 they stay narrow at rest; on the CPU a busy model widens them once, in a second session, until it \
                 is idle ([onnx] fold_constants = false: never; true: at load)"
            );
        }
        widened == 0
    })
}

/// A session's settings, beside the model's own configuration.
#[derive(Clone, Copy)]
pub(crate) struct SessionOptions<'a> {
    /// `[onnx] intra_op_threads`: a pool of the session's own; `None` shares the process's.
    pub(crate) own_threads: Option<usize>,
    pub(crate) fold_constants: bool,
    pub(crate) default_precision: Precision,
    /// The model's bytes, where they differ from its file's (see [`crate::late`]).
    pub(crate) model: Option<&'a [u8]>,
}

pub(crate) fn open_session(
    runtime: &Runtime,
    config: &ModelConfig,
    options: &SessionOptions<'_>,
    placement: Placement,
) -> Result<Session> {
    let fail = |e: &dyn std::fmt::Display| Error::Engine(format!("model `{}`: {e}", config.name));
    let SessionOptions { own_threads, fold_constants, default_precision, model } = *options;
    let mut builder = Session::builder(&runtime.environment)
        .and_then(|b| match own_threads {
            Some(threads) => b
                .with_independent_thread_pool()
                .map_err(ort::Error::from)
                .and_then(|b| b.with_intra_threads(threads.max(1)).map_err(Into::into)),
            None => Ok(b),
        })
        .and_then(|b| b.with_inter_threads(1).map_err(Into::into))
        // ONNX Runtime's pool threads spin between operators by default. In a server the runtime's threads and the
        // other models share the cores with them, and a spinning thread burns the time they need: measured on 2
        // cores, spinning took a third of the server's CPU with no work to do (benches/README.md).
        .and_then(|b| b.with_intra_op_spinning(false).map_err(Into::into))
        .and_then(|b| b.with_inter_op_spinning(false).map_err(Into::into))
        .map_err(|e| fail(&e))?;
    if !fold_constants {
        builder = builder.with_disabled_optimizers("ConstantFolding").map_err(|e| fail(&e))?;
    }
    // The CPU provider comes last, with or without its arena (`[onnx] cpu_arena`): it runs what a GPU's providers
    // do not, and everything on the CPU.
    let cpu = ep::CPU::default().with_arena_allocator(config.onnx.cpu_arena).build().error_on_failure();
    let mut providers = Vec::new();
    if let Placement::Gpu { device, .. } = placement {
        let id = i32::try_from(device).map_err(|_| fail(&format!("no GPU numbered {device}")))?;
        if config.onnx.tensorrt {
            providers.push(
                ep::TensorRT::default()
                    .with_device_id(id)
                    .with_fp16(tensorrt_fp16(config, default_precision))
                    .build()
                    .error_on_failure(),
            );
        }
        // The CUDA arena grows by what a batch asks for, not to the next power of two, and no further than
        // `[onnx] gpu_mem_limit`.
        let mut cuda =
            ep::CUDA::default().with_device_id(id).with_arena_extend_strategy(ep::ArenaExtendStrategy::SameAsRequested);
        if let Some(limit) = config.onnx.gpu_mem_limit {
            cuda = cuda.with_memory_limit(usize::try_from(limit).unwrap_or(usize::MAX));
        }
        providers.push(cuda.build().error_on_failure());
        providers.push(cpu);
        builder = builder
            .with_execution_providers(providers)
            .map_err(|e| fail(&format!("cannot use GPU {device} (CUDA execution provider): {e}")))?;
    } else {
        providers.push(cpu);
        builder = builder.with_execution_providers(providers).map_err(|e| fail(&e))?;
    }
    match model {
        Some(bytes) => builder.commit_from_memory(bytes),
        None if !config.file.is_file() => {
            return Err(Error::config(&config.file, "the model file named by `file` does not exist"))
        }
        None => builder.commit_from_file(&config.file),
    }
    .map_err(|e| fail(&format!("cannot load {}: {e}", config.file.display())))
}
