//! The drain: how the server stops once told to, phase by phase. [`Drain`] owns the phase; the routes read it
//! (readiness, the end of the drain), and [`Server::serve`](crate::Server::serve) drives it.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How far shutdown has gone. Each phase follows the one before; none comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not shutting down.
    Serving,
    /// Readiness fails, so that load balancers take the server out; requests and connections are still taken
    /// for the drain delay.
    Draining,
    /// No new connections; what is in flight or queued has the drain timeout, counted from `since`, to finish.
    Closing { since: Instant },
    /// The drain timeout passed: every request still being handled is answered 503.
    Expired,
}

/// The server's shutdown phase and its timings. Shared by the app state (readers) and `serve` (the only writer).
pub struct Drain {
    phase: watch::Sender<Phase>,
    /// How long requests are still served after readiness fails.
    delay: Duration,
    /// How long in-flight and queued work has, once no new connections are taken.
    timeout: Duration,
}

/// How long answers already given may take to be written after the drain timeout, before the server closes.
const LAST_WORDS: Duration = Duration::from_secs(2);

impl Drain {
    pub fn new(delay: Duration, timeout: Duration) -> Self {
        Drain { phase: watch::Sender::new(Phase::Serving), delay, timeout }
    }

    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// True from the moment shutdown begins.
    pub fn is_draining(&self) -> bool {
        self.phase() != Phase::Serving
    }

    /// Readiness fails from now on.
    pub fn begin(&self) {
        self.phase.send_if_modified(|p| {
            let serving = *p == Phase::Serving;
            if serving {
                *p = Phase::Draining;
            }
            serving
        });
    }

    /// The phase as it changes, for those that act on each change (the gRPC health service).
    pub fn watch(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// Resolves once the server takes no new connections (the closing phase, or later).
    pub async fn closing(&self) {
        let mut phase = self.phase.subscribe();
        if phase.wait_for(|p| matches!(p, Phase::Closing { .. } | Phase::Expired)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once the drain timeout has passed; never, if it does not.
    pub async fn expired(&self) {
        let mut phase = self.phase.subscribe();
        if phase.wait_for(|p| *p == Phase::Expired).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The first phases, as the HTTP server's graceful-shutdown signal: waits for `shutdown`, fails readiness,
    /// keeps serving for the delay, calls `flush` (batchers stop waiting for fuller batches), and resolves when
    /// the server should take no new connections.
    pub async fn until_closing(
        self: Arc<Self>,
        shutdown: impl Future<Output = ()> + Send + 'static,
        flush: impl FnOnce() + Send + 'static,
    ) {
        shutdown.await;
        self.begin();
        if !self.delay.is_zero() {
            tracing::info!(delay_s = self.delay.as_secs_f64(), "shutting down: readiness fails; still serving");
            tokio::time::sleep(self.delay).await;
        }
        flush();
        tracing::info!("shutting down: no new connections; finishing in-flight and queued requests");
        self.phase.send_replace(Phase::Closing { since: Instant::now() });
    }

    /// Waits for the server task (HTTP, and gRPC when served) to finish: for as long as it likes until the closing phase begins, then
    /// for what is left of the drain timeout. Past that the drain expires (the handlers still running answer
    /// 503), the answers get a moment to be written, and the task is aborted.
    pub async fn finish(&self, mut server: JoinHandle<std::io::Result<()>>) -> anyhow::Result<()> {
        let mut phase = self.phase.subscribe();
        let closing = async {
            let closed = phase.wait_for(|p| matches!(p, Phase::Closing { .. })).await.map(|p| *p);
            match closed {
                Ok(Phase::Closing { since }) => since,
                Ok(_) => Instant::now(),
                Err(_) => std::future::pending().await,
            }
        };
        let since = tokio::select! {
            served = &mut server => return served_result(served),
            since = closing => since,
        };
        let left = self.timeout.saturating_sub(since.elapsed());
        if let Ok(served) = tokio::time::timeout(left, &mut server).await {
            return served_result(served);
        }
        tracing::warn!(timeout_s = self.timeout.as_secs_f64(), "drain timed out; answering what is left with 503");
        self.phase.send_replace(Phase::Expired);
        match tokio::time::timeout(LAST_WORDS, &mut server).await {
            Ok(served) => served_result(served),
            Err(_) => {
                server.abort();
                Ok(())
            }
        }
    }
}

fn served_result(served: Result<std::io::Result<()>, tokio::task::JoinError>) -> anyhow::Result<()> {
    use anyhow::Context;
    served.context("the server task failed")?.context("the server failed")
}
