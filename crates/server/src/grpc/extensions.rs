//! Triton's extensions beyond inference over gRPC, each the wire around the operation its HTTP route calls:
//! system and CUDA shared memory's status, and the log and trace settings.

use crate::codec::grpc::proto::cuda_shared_memory_status_response::RegionStatus as CudaRegionStatus;
use crate::codec::grpc::proto::system_shared_memory_status_response::RegionStatus;
use crate::codec::grpc::proto::{
    CudaSharedMemoryStatusRequest, CudaSharedMemoryStatusResponse, LogSettingsRequest, LogSettingsResponse,
    SystemSharedMemoryStatusRequest, SystemSharedMemoryStatusResponse, TraceSettingRequest, TraceSettingResponse,
};
use crate::codec::quoted;
use crate::error::AppError;
use crate::logging::{logging, LogUpdate};
use crate::request::resolve_named;
use crate::state::AppState;

/// The registered system shared-memory regions, or the one named.
pub fn system_status(
    state: &AppState,
    request: SystemSharedMemoryStatusRequest,
) -> Result<SystemSharedMemoryStatusResponse, AppError> {
    let name = request.name;
    let regions = state.shared_memory().status((!name.is_empty()).then_some(name.as_str()))?;
    let regions = regions
        .into_iter()
        .map(|r| (r.name.clone(), RegionStatus { name: r.name, key: r.key, offset: r.offset, byte_size: r.byte_size }))
        .collect();
    Ok(SystemSharedMemoryStatusResponse { regions })
}

/// The registered CUDA shared-memory regions, or the one named.
pub fn cuda_status(
    state: &AppState,
    request: CudaSharedMemoryStatusRequest,
) -> Result<CudaSharedMemoryStatusResponse, AppError> {
    let name = request.name;
    let regions = state.shared_memory().cuda_status((!name.is_empty()).then_some(name.as_str()))?;
    let regions = regions
        .into_iter()
        .map(|r| (r.name.clone(), CudaRegionStatus { name: r.name, device_id: r.device_id, byte_size: r.byte_size }))
        .collect();
    Ok(CudaSharedMemoryStatusResponse { regions })
}

/// The log's settings, after the request's changes (none: read only).
pub fn log_settings(request: LogSettingsRequest) -> Result<LogSettingsResponse, AppError> {
    use crate::codec::grpc::proto::log_settings_request::setting_value::ParameterChoice as Given;
    use crate::codec::grpc::proto::log_settings_response::setting_value::ParameterChoice as Answered;
    use crate::codec::grpc::proto::log_settings_response::SettingValue;

    let logging = logging();
    let settings = if request.settings.is_empty() {
        logging.settings()
    } else {
        let mut update = LogUpdate::default();
        for (name, value) in request.settings {
            let value = value.parameter_choice;
            let wrong = |kind: &str| AppError::bad_request(format!("log setting `{}` takes {kind}", quoted(&name)));
            match (name.as_str(), value) {
                ("log_file", Some(Given::StringParam(v))) => update.log_file = Some(v),
                ("log_format", Some(Given::StringParam(v))) => update.log_format = Some(v),
                ("log_info", Some(Given::BoolParam(v))) => update.log_info = Some(v),
                ("log_warning", Some(Given::BoolParam(v))) => update.log_warning = Some(v),
                ("log_error", Some(Given::BoolParam(v))) => update.log_error = Some(v),
                ("log_verbose_level", Some(Given::Uint32Param(v))) => update.log_verbose_level = Some(v),
                ("log_file" | "log_format", _) => return Err(wrong("a string")),
                ("log_info" | "log_warning" | "log_error", _) => return Err(wrong("a bool")),
                ("log_verbose_level", _) => return Err(wrong("a uint32")),
                _ => return Err(AppError::bad_request(format!("unknown log setting `{}`", quoted(&name)))),
            }
        }
        logging.update(update)?
    };
    let value = |choice| SettingValue { parameter_choice: Some(choice) };
    let settings = [
        ("log_file", value(Answered::StringParam(settings.log_file))),
        ("log_info", value(Answered::BoolParam(settings.log_info))),
        ("log_warning", value(Answered::BoolParam(settings.log_warning))),
        ("log_error", value(Answered::BoolParam(settings.log_error))),
        ("log_verbose_level", value(Answered::Uint32Param(settings.log_verbose_level))),
        ("log_format", value(Answered::StringParam(settings.log_format))),
    ];
    Ok(LogSettingsResponse { settings: settings.into_iter().map(|(n, v)| (n.to_owned(), v)).collect() })
}

/// The trace settings of the model named, or the server's, after the request's changes (an empty list resets a
/// setting, as Triton reads it).
pub fn trace_setting(state: &AppState, request: TraceSettingRequest) -> Result<TraceSettingResponse, AppError> {
    use crate::codec::grpc::proto::trace_setting_response::SettingValue;

    let model = (!request.model_name.is_empty()).then_some(request.model_name.as_str());
    if let Some(model) = model {
        resolve_named(state.registry(), model, "")?;
    }
    if !request.settings.is_empty() {
        let changes = request
            .settings
            .into_iter()
            .map(|(name, value)| (name, (!value.value.is_empty()).then_some(value.value)))
            .collect();
        state.traces().update(model, changes)?;
    }
    let settings = state.traces().settings(model);
    Ok(TraceSettingResponse {
        settings: settings.into_iter().map(|(name, value)| (name.to_owned(), SettingValue { value })).collect(),
    })
}
