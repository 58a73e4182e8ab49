//! The `inferd` binary: parses the command line, sets up logging, and runs the server until SIGTERM or SIGINT.

use clap::Parser;
use inferd_server::{Cli, Command};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The environment is the process's: set before the runtime starts its threads.
    if let Command::Serve(config) = &cli.command {
        inferd_models::budget::set_cublas_workspace(config.cublas_workspace_mib);
        inferd_candle::fix_cpu_threads();
    }
    // A runtime thread about to sleep may first poll for the next request (`--poll-idle-us`).
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(inferd_server::idle::before_park)
        .build()?
        .block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(config) => {
            inferd_server::logging::init(&config.log, config.log_format);
            // The connections are watched only where the runtime's hook polls them (see `main`).
            let poll_for = std::time::Duration::from_micros(config.poll_idle_us);
            if let Err(e) = inferd_server::idle::enable(poll_for) {
                tracing::warn!(error = %e, "cannot watch connections for --poll-idle-us: runtime threads sleep when idle");
            }
            inferd_server::run(config, shutdown_signal()).await
        }
        Command::Healthcheck(config) => {
            if let Err(e) = inferd_server::healthcheck(&config).await {
                eprintln!("inferd healthcheck: {e:#}");
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

/// Resolves on the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
