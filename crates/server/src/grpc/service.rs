//! `inference.GRPCInferenceService`: each RPC is the wire around one operation of [`crate::ops`], as the KServe v2
//! HTTP routes are; inference goes through the same decode, [`infer`] and encode steps, with the gRPC codec.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use inferd_models::{Input, Request as InferRequest};
use prost::Message;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::extensions;
use super::messages::{model_config, model_statistics};
use super::proto::grpc_inference_service_server::GrpcInferenceService;
use super::{deadline_of, Deadline};
use crate::budget::Hold;
use crate::codec::grpc::proto::*;
use crate::codec::grpc::{decode_infer, encode_infer};
use crate::codec::shm;
use crate::codec::v2::models as v2;
use crate::error::{AppError, ErrorKind};
use crate::metrics::Protocol;
use crate::ops::infer::{
    answers_to_device, classify_outputs, deadline_in, decode, decode_bytes, encode_shared, infer, scan_outputs_on_write,
};
use crate::ops::models;
use crate::ops::repository;
use crate::registry::ModelEntry;
use crate::request::resolve_named;
use crate::shm::Kind;
use crate::state::AppState;

/// Requests one stream may have in flight: past it, the stream's next message is read once one is answered (the
/// client's sends wait on HTTP/2 flow control), so a single stream cannot queue without bound.
pub const STREAM_IN_FLIGHT: usize = 256;

/// How long a stream must have been quiet, nothing running, before the drain ends it. Longer than HTTP's quiet
/// time for idle connections: a stream's client is often a loop that sends its next request when an answer
/// comes, and on a busy machine that may take a while.
pub const STREAM_QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// The service, over the server's state.
#[derive(Clone)]
pub struct Inference {
    pub state: AppState,
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl GrpcInferenceService for Inference {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Answer<ServerLiveResponse> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Answer<ServerReadyResponse> {
        Ok(Response::new(ServerReadyResponse { ready: models::server_ready(&self.state).is_ok() }))
    }

    async fn model_ready(&self, request: Request<ModelReadyRequest>) -> Answer<ModelReadyResponse> {
        let ModelReadyRequest { name, version } = request.into_inner();
        // A model or version the server does not have (a version that is not a number among them) is not ready, as
        // Triton answers: tritonclient's is_model_ready returns False rather than raising.
        let ready = resolve_named(self.state.registry(), &name, &version)
            .is_ok_and(|model| models::model_ready(&model).is_ok());
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(&self, _: Request<ServerMetadataRequest>) -> Answer<ServerMetadataResponse> {
        let meta = models::server_metadata();
        Ok(Response::new(ServerMetadataResponse {
            name: meta.name.to_owned(),
            version: meta.version.to_owned(),
            extensions: meta.extensions.iter().map(|&e| e.to_owned()).collect(),
        }))
    }

    async fn model_metadata(&self, request: Request<ModelMetadataRequest>) -> Answer<ModelMetadataResponse> {
        let ModelMetadataRequest { name, version } = request.into_inner();
        let model = resolve_named(self.state.registry(), &name, &version)?;
        let meta = models::model_metadata(&self.state, &model)?;
        let tensors = |specs: Vec<v2::V2TensorMetadata>| {
            specs
                .into_iter()
                .map(|t| model_metadata_response::TensorMetadata {
                    name: t.name,
                    datatype: t.datatype.as_str().to_owned(),
                    shape: t.shape,
                })
                .collect()
        };
        Ok(Response::new(ModelMetadataResponse {
            name: meta.name,
            versions: meta.versions,
            platform: meta.platform.to_owned(),
            inputs: tensors(meta.inputs),
            outputs: tensors(meta.outputs),
        }))
    }

    async fn model_infer(&self, request: Request<ModelInferRequest>) -> Answer<ModelInferResponse> {
        let deadline = deadline_of(&request);
        // The gate held the message's bytes as they arrived.
        let hold = request.extensions().get::<Arc<Hold>>().cloned();
        let answer = infer_counted(&self.state, request.into_inner(), deadline, hold).await?;
        Ok(Response::new(answer))
    }

    type ModelStreamInferStream = Pin<Box<dyn Stream<Item = Result<ModelStreamInferResponse, Status>> + Send>>;

    async fn model_stream_infer(
        &self,
        request: Request<Streaming<ModelInferRequest>>,
    ) -> Answer<Self::ModelStreamInferStream> {
        let deadline = deadline_of(&request);
        // Answers wait here for the client to read them; past this, the requests that finish wait to send theirs.
        let (sender, receiver) = mpsc::channel(64);
        tokio::spawn(serve_stream(self.state.clone(), request.into_inner(), deadline, sender));
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))))
    }

    async fn model_config(&self, request: Request<ModelConfigRequest>) -> Answer<ModelConfigResponse> {
        let ModelConfigRequest { name, version } = request.into_inner();
        let model = resolve_named(self.state.registry(), &name, &version)?;
        Ok(Response::new(ModelConfigResponse { config: Some(model_config(models::model_config(&model)?)) }))
    }

    async fn model_statistics(&self, request: Request<ModelStatisticsRequest>) -> Answer<ModelStatisticsResponse> {
        let ModelStatisticsRequest { name, version } = request.into_inner();
        let chosen = models::stats_of(
            &self.state,
            (!name.is_empty()).then_some(name.as_str()),
            (!version.is_empty()).then_some(version.as_str()),
        )?;
        let model_stats = models::statistics(&chosen).into_iter().map(model_statistics).collect();
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(&self, request: Request<RepositoryIndexRequest>) -> Answer<RepositoryIndexResponse> {
        let index = repository::index(&self.state, request.into_inner().ready).await?;
        let models = index
            .into_iter()
            .map(|e| repository_index_response::ModelIndex {
                name: e.name,
                version: e.version,
                state: e.state.to_owned(),
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> Answer<RepositoryModelLoadResponse> {
        repository::control_allowed(&self.state)?;
        let RepositoryModelLoadRequest { model_name, parameters, .. } = request.into_inner();
        repository::load(&self.state, model_name, parameters.keys().map(String::as_str)).await?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> Answer<RepositoryModelUnloadResponse> {
        repository::unload(&self.state, &request.into_inner().model_name).await?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<SystemSharedMemoryStatusRequest>,
    ) -> Answer<SystemSharedMemoryStatusResponse> {
        Ok(Response::new(extensions::system_status(&self.state, request.into_inner())?))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Answer<SystemSharedMemoryRegisterResponse> {
        let SystemSharedMemoryRegisterRequest { name, key, offset, byte_size } = request.into_inner();
        self.state.shared_memory().register(name, key, offset, byte_size).await?;
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        request: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Answer<SystemSharedMemoryUnregisterResponse> {
        let name = request.into_inner().name;
        self.state.shared_memory().unregister(Kind::System, (!name.is_empty()).then_some(name.as_str())).await;
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        request: Request<CudaSharedMemoryStatusRequest>,
    ) -> Answer<CudaSharedMemoryStatusResponse> {
        Ok(Response::new(extensions::cuda_status(&self.state, request.into_inner())?))
    }

    async fn cuda_shared_memory_register(
        &self,
        request: Request<CudaSharedMemoryRegisterRequest>,
    ) -> Answer<CudaSharedMemoryRegisterResponse> {
        let CudaSharedMemoryRegisterRequest { name, raw_handle, device_id, byte_size } = request.into_inner();
        let handle = crate::shm::Handle::Bytes(raw_handle);
        self.state.shared_memory().register_cuda(name, handle, device_id, byte_size).await?;
        Ok(Response::new(CudaSharedMemoryRegisterResponse {}))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        request: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> Answer<CudaSharedMemoryUnregisterResponse> {
        let name = request.into_inner().name;
        self.state.shared_memory().unregister(Kind::Cuda, (!name.is_empty()).then_some(name.as_str())).await;
        Ok(Response::new(CudaSharedMemoryUnregisterResponse {}))
    }

    async fn trace_setting(&self, request: Request<TraceSettingRequest>) -> Answer<TraceSettingResponse> {
        Ok(Response::new(extensions::trace_setting(&self.state, request.into_inner())?))
    }

    async fn log_settings(&self, request: Request<LogSettingsRequest>) -> Answer<LogSettingsResponse> {
        Ok(Response::new(extensions::log_settings(request.into_inner())?))
    }
}

/// One inference request, counted in the metrics under `protocol="grpc"` with the status the one error table
/// gives its outcome.
pub(super) async fn infer_counted(
    state: &AppState,
    request: ModelInferRequest,
    deadline: Option<Deadline>,
    hold: Option<Arc<Hold>>,
) -> Result<ModelInferResponse, AppError> {
    let started = Instant::now();
    let metrics = state.metrics();
    let model = match resolve_named(state.registry(), &request.model_name, &request.model_version) {
        Ok(model) => model,
        Err(e) => {
            metrics.request_done("", Protocol::Grpc, e.status().as_u16(), started.elapsed());
            return Err(e);
        }
    };
    let label = model.label();
    let in_flight = metrics.enter(&label, Protocol::Grpc);
    // A unary RPC's gate bounds it by the request timeout and the drain; a stream's requests are bounded here.
    let gated = hold.is_some();
    // Boxed: an async fn's future holds its argument futures twice over (once as arguments, once as the locals
    // they move into), so the deadline's and the server's bounds around the work would each double it, and the
    // whole (tens of kilobytes) would be copied into tonic's box on every call.
    let work = Box::pin(infer_one(state, &model, request, deadline, hold));
    let answer = bounded(state, work, deadline, gated).await;
    drop(in_flight);
    let code = answer.as_ref().map_or_else(|e| e.status().as_u16(), |_| 200);
    metrics.request_done(&label, Protocol::Grpc, code, started.elapsed());
    answer
}

/// `work`, answered within the request's deadline, and unless the gate already bounds it (`gated`: a unary RPC),
/// within the server's `--request-timeout` and the drain's end.
async fn bounded<T>(
    state: &AppState,
    work: impl std::future::Future<Output = Result<T, AppError>>,
    deadline: Option<Deadline>,
    gated: bool,
) -> Result<T, AppError> {
    let within_deadline = async {
        let Some(Deadline(at)) = deadline else { return work.await };
        tokio::select! {
            answer = work => answer,
            () = tokio::time::sleep_until(at.into()) => {
                Err(AppError::new(ErrorKind::DeadlineExceeded, "the request's deadline (grpc-timeout) passed"))
            }
        }
    };
    if gated {
        within_deadline.await
    } else {
        state.bounded(within_deadline, Err).await
    }
}

/// Decodes, infers and encodes one request on `model`; its bytes count against the in-flight budget until it is
/// answered: in `held`, where the gate held them as they arrived, or from here on.
async fn infer_one(
    state: &AppState,
    model: &ModelEntry,
    request: ModelInferRequest,
    deadline: Option<Deadline>,
    held: Option<Arc<Hold>>,
) -> Result<ModelInferResponse, AppError> {
    let model = model.serving()?;
    let len = request.encoded_len();
    let hold = match held {
        Some(hold) => hold,
        None => {
            let hold = state.budget().hold();
            hold.take(len)?;
            hold
        }
    };
    let limits = *state.limits();
    let regions = state.shared_memory().clone();
    let names_a_region = || request.inputs.iter().any(|i| i.parameters.contains_key(shm::REGION_PARAMETER));
    let len = decode_bytes(&model, len, &regions, names_a_region);
    let mut call = decode(&model, len, move |meta| decode_infer(request, meta, &limits, &*regions)).await?;
    let deadline = [call.timeout.and_then(deadline_in), deadline.map(|d| d.0)].into_iter().flatten().min();
    let request = InferRequest::new(Input::Tensors(call.inputs)).with_deadline(deadline);
    let request = scan_outputs_on_write(state, &model, request, &mut call.outputs, &call.classification);
    let request = crate::ops::text::with_dimensions(&model, request, call.dimensions)?;
    let served = infer(state, &model, request, &hold).await?;
    let (id, selection, classification, read) = (call.id, call.outputs, call.classification, call.input_memory);
    let encoder = model.clone();
    let to_device = answers_to_device(&selection);
    encode_shared(served, to_device, move |mut served| {
        let meta = encoder.metadata();
        classify_outputs(&encoder, &mut served.answer.tensors, &classification)?;
        encode_infer(encoder.name(), encoder.version, id, meta, &served.answer.tensors, &selection, &read)
    })
    .await
}

/// Serves one `ModelStreamInfer` stream: each request runs as it arrives, many at once, and is answered as it
/// finishes, with its id; a request's error is its own answer's `error_message`, and the stream goes on. The
/// client closing its side ends the stream once every answer is sent; the client going away (a cancel, a dropped
/// connection) stops the requests still running, which frees their places in the queues. Once the drain stops
/// taking connections, a stream still in use is served on; one that has been quiet for [`STREAM_QUIET`], nothing
/// running, ends UNAVAILABLE, so that its client opens its next one elsewhere and no idle stream holds the drain. Past the stream's own deadline it ends DEADLINE_EXCEEDED.
async fn serve_stream(
    state: AppState,
    mut inbound: Streaming<ModelInferRequest>,
    deadline: Option<Deadline>,
    sender: mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
) {
    let mut running = JoinSet::new();
    // Each running request's id and model, to answer for it if its task panics.
    let mut asked: HashMap<tokio::task::Id, ModelInferResponse> = HashMap::new();
    let mut open = true;
    let mut closing = false;
    let mut last_active = Instant::now();
    let deadline_passed = async {
        match deadline {
            Some(Deadline(at)) => tokio::time::sleep_until(at.into()).await,
            None => std::future::pending().await,
        }
    };
    let mut deadline_passed = std::pin::pin!(deadline_passed);
    // Made once, not per message: each is a subscription to the drain's phase.
    let drain = state.drain().clone();
    let mut drain_closing = std::pin::pin!(drain.closing());
    while open || !running.is_empty() {
        tokio::select! {
            message = inbound.message(), if open && running.len() < STREAM_IN_FLIGHT => match message {
                Ok(Some(request)) => {
                    last_active = Instant::now();
                    let (state, sender) = (state.clone(), sender.clone());
                    let echo = ModelInferResponse {
                        model_name: request.model_name.clone(),
                        model_version: request.model_version.clone(),
                        id: request.id.clone(),
                        ..Default::default()
                    };
                    let failed = echo.clone();
                    let task = running.spawn(async move {
                        let answer = match infer_counted(&state, request, deadline, None).await {
                            Ok(response) => {
                                ModelStreamInferResponse { error_message: String::new(), infer_response: Some(response) }
                            }
                            Err(e) => ModelStreamInferResponse { error_message: e.message, infer_response: Some(failed) },
                        };
                        let _ = sender.send(Ok(answer)).await;
                    });
                    asked.insert(task.id(), echo);
                }
                Ok(None) => open = false,
                Err(status) => {
                    // The stream broke: the client cancelled or went away (nobody reads what is left), or sent a
                    // message that cannot be read (past --max-body-bytes, say), which ends the stream with it.
                    let _ = sender.send(Err(super::stream_error(status, state.max_body_bytes()))).await;
                    return;
                }
            },
            Some(joined) = running.join_next_with_id(), if !running.is_empty() => match joined {
                Ok((task, ())) => {
                    last_active = Instant::now();
                    asked.remove(&task);
                }
                Err(e) => {
                    let echo = asked.remove(&e.id()).unwrap_or_default();
                    tracing::error!(id = %echo.id, "a stream request's task failed: {e}");
                    let answer = ModelStreamInferResponse {
                        error_message: "the request's handler panicked".to_owned(),
                        infer_response: Some(echo),
                    };
                    let _ = sender.send(Ok(answer)).await;
                }
            },
            () = &mut drain_closing, if open && !closing => closing = true,
            // While the drain closes, a stream that has gone quiet, nothing running, is ended: one still in use
            // is served until its client closes it (or the drain's time runs out).
            () = tokio::time::sleep_until((last_active + STREAM_QUIET).into()), if open && closing && running.is_empty() => {
                open = false;
            }
            () = &mut deadline_passed => {
                let _ = sender.send(Err(Status::deadline_exceeded("the stream's deadline (grpc-timeout) passed"))).await;
                return;
            }
            () = sender.closed() => return,
        }
    }
    if closing {
        let _ = sender.send(Err(Status::unavailable("the server is shutting down: open a new stream"))).await;
    }
}
