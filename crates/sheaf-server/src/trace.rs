//! Triton's trace extension over HTTP and gRPC: the trace settings read and changed
//! (`GET`/`POST /v2[/models/{m}]/trace/setting`, gRPC `TraceSetting`, tritonclient's
//! `get_trace_settings` and `update_trace_settings`), and the sampling of each answered inference
//! request. The settings, the sampling and the trace files are [`sheaf_core::trace`]'s; this
//! module only reads the protocols' forms of them.

use sheaf_core::trace::{Change, Protocol};
use sheaf_core::{InferError, InferResponse, RawRequest};

use crate::AppState;

/// The settings in force for `model` (the server's without one), by name, each as its values.
pub fn settings(
    state: &AppState,
    model: Option<&str>,
) -> Result<Vec<(&'static str, Vec<String>)>, InferError> {
    let model = known(state, model)?;
    Ok(state.traces.shown(model))
}

/// Changes the settings of `model` (the server's without one): all or none.
pub fn update(
    state: &AppState,
    model: Option<&str>,
    changes: &[(String, Change)],
) -> Result<(), InferError> {
    let model = known(state, model)?;
    state.traces.update(model, changes)
}

/// A model's name, checked: an unknown model has no settings. No name (or an empty one, as
/// gRPC sends it): the server's.
fn known<'m>(state: &AppState, model: Option<&'m str>) -> Result<Option<&'m str>, InferError> {
    match model.filter(|m| !m.is_empty()) {
        Some(name) => {
            state.manager.readiness(name, None)?;
            Ok(Some(name))
        }
        None => Ok(None),
    }
}

/// Readies a request for its trace while tracing is on: it keeps the accounts of the requests
/// its model sends on its behalf, which its trace holds if it is sampled.
pub fn prepare(state: &AppState, request: &mut RawRequest) {
    if state.traces.is_active() {
        request.calls = Some(sheaf_backend::TraceCalls::default());
    }
}

/// Samples an answered request for a trace: a sampled one's receipt records it once the answer
/// has been sent.
pub fn sample(state: &AppState, response: &mut InferResponse, protocol: Protocol) {
    let Some(receipt) = response.receipt.as_mut() else {
        return;
    };
    if let Some(ticket) = state.traces.sample(
        &response.model_name,
        &response.model_version,
        response.id.as_deref(),
        protocol,
    ) {
        receipt.trace(ticket);
    }
}
