//! The system shared-memory extension over HTTP: register, unregister and status of regions
//! (see [`crate::shm`]); and the CUDA one's routes, which say that no CUDA region is taken.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::AppState;

/// `POST /v2/systemsharedmemory/region/{name}/register` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Register {
    key: String,
    #[serde(default)]
    offset: u64,
    byte_size: u64,
}

pub async fn register(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let r: Register = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("a register body is {{\"key\", \"offset\", \"byte_size\"}}: {e}"),
        )
    })?;
    state.shm.register(&name, &r.key, r.offset, r.byte_size)?;
    Ok(Json(json!({})))
}

/// `POST /v2/systemsharedmemory/region/{name}/unregister`.
pub async fn unregister(State(state): State<AppState>, Path(name): Path<String>) -> Json<Value> {
    state.shm.unregister(&name);
    Json(json!({}))
}

/// `POST /v2/systemsharedmemory/unregister`: every region.
pub async fn unregister_all(State(state): State<AppState>) -> Json<Value> {
    state.shm.unregister("");
    Json(json!({}))
}

/// `GET /v2/systemsharedmemory/region/{name}/status`.
pub async fn status(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    render(&state, &name)
}

/// `GET /v2/systemsharedmemory/status`: every region.
pub async fn status_all(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    render(&state, "")
}

fn render(state: &AppState, name: &str) -> Result<Json<Value>, ApiError> {
    let regions: Vec<Value> = state
        .shm
        .status(name)?
        .into_iter()
        .map(
            |r| json!({"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}),
        )
        .collect();
    Ok(Json(Value::Array(regions)))
}

/// `GET /v2/cudasharedmemory/status`: no CUDA region is ever registered.
pub async fn cuda_status_all() -> Json<Value> {
    Json(json!([]))
}

/// `GET /v2/cudasharedmemory/region/{name}/status`: 404, naming what to use instead.
pub async fn cuda_status(Path(name): Path<String>) -> ApiError {
    crate::shm::no_cuda_region(&name).into()
}

/// `POST /v2/cudasharedmemory/region/{name}/register`: 501, naming what to use instead.
pub async fn cuda_register() -> ApiError {
    ApiError::new(StatusCode::NOT_IMPLEMENTED, crate::shm::NO_CUDA)
}

/// `POST /v2/cudasharedmemory/region/{name}/unregister` and `/v2/cudasharedmemory/unregister`:
/// done, as there is none.
pub async fn cuda_unregister() -> Json<Value> {
    Json(json!({}))
}
