//! The standard `grpc.health.v1.Health` service, for Kubernetes' gRPC probes and gRPC load balancers: `SERVING`
//! (for the server, `""`, and for [`SERVICE`]) while the server is ready, `NOT_SERVING` while it starts, is
//! degraded past what readiness allows, or drains. `Check` reads readiness when asked; a `Watch` stream says each
//! change, and ends when the drain stops taking connections, so that no watcher holds the drain open.

use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::SERVICE;
use crate::state::AppState;

/// How often a `Watch` stream looks at readiness (at once on each drain phase).
const WATCH_PERIOD: Duration = Duration::from_millis(100);

/// The health service over the server's state.
pub struct Probe {
    state: AppState,
}

/// The health service as the gRPC app serves it.
pub type Server = HealthServer<Probe>;

/// The health service, ready to route.
pub fn service(state: AppState) -> Server {
    HealthServer::new(Probe { state })
}

impl Probe {
    /// The status of `service`, or `None` for a service this server does not have.
    fn status(&self, service: &str) -> Option<ServingStatus> {
        (service.is_empty() || service == SERVICE).then(|| match self.state.readiness() {
            None => ServingStatus::Serving,
            Some(_) => ServingStatus::NotServing,
        })
    }
}

fn answer(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse { status: status as i32 }
}

#[tonic::async_trait]
impl Health for Probe {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &request.get_ref().service;
        match self.status(service) {
            Some(status) => Ok(Response::new(answer(status))),
            None => Err(Status::not_found(format!("no service `{service}`: this server has \"\" and `{SERVICE}`"))),
        }
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

    async fn watch(&self, request: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let service = request.into_inner().service;
        let probe = Probe { state: self.state.clone() };
        let (sender, receiver) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut phase = probe.state.drain().watch();
            let mut last = None;
            loop {
                let status = probe.status(&service).unwrap_or(ServingStatus::ServiceUnknown);
                if last != Some(status) {
                    last = Some(status);
                    if sender.send(Ok(answer(status))).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    changed = phase.changed() => if changed.is_err() { return },
                    () = tokio::time::sleep(WATCH_PERIOD) => {}
                    () = probe.state.drain().closing() => {
                        // The last word is NOT_SERVING; the watcher reconnects elsewhere.
                        let status = probe.status(&service).unwrap_or(ServingStatus::ServiceUnknown);
                        if last != Some(status) {
                            let _ = sender.send(Ok(answer(status))).await;
                        }
                        return;
                    }
                    () = sender.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))))
    }
}
