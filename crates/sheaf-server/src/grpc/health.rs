//! gRPC's health checking protocol, `grpc.health.v1.Health`, beside the inference service on
//! the gRPC port, as Triton serves it: what Kubernetes' gRPC probes, `grpc_health_probe`,
//! Envoy and gRPC's client-side health checking call.
//!
//! The server (service `""`, or `inference.GRPCInferenceService` by name) is SERVING when it is
//! ready, as `ServerReady` and `/v2/health/ready` answer, and NOT_SERVING before its models
//! are up and from the moment a drain is announced. Another service name is NOT_FOUND for
//! `Check` and SERVICE_UNKNOWN for `Watch`, as the protocol says. `Watch` sends the status at
//! once and again each time it changes (looked at every [`WATCH_EVERY`], and at once when a
//! drain is announced); it ends after a drain's NOT_SERVING, so that the connection can close.
//! Like the probes over HTTP it takes no key, and it is in the `health` category of Triton's
//! restricted groups.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::service::allow;
use crate::access::Scope;
use crate::restricted::Api;
use crate::AppState;

pub use tonic_health::pb::health_server::HealthServer;

/// The inference service's full name, which a health check may ask for.
pub const INFERENCE_SERVICE: &str = "inference.GRPCInferenceService";

/// How often a `Watch` looks at the server's readiness.
pub const WATCH_EVERY: Duration = Duration::from_millis(500);

/// The health service over the server's state.
pub struct HealthService {
    state: AppState,
}

impl HealthService {
    pub fn new(state: AppState) -> HealthService {
        HealthService { state }
    }
}

fn known(service: &str) -> bool {
    service.is_empty() || service == INFERENCE_SERVICE
}

async fn serving(state: &AppState) -> ServingStatus {
    if state.ready_checked().await {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

fn answer(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        allow(&self.state, request.metadata(), Api::Health, Scope::Open)?;
        let service = &request.get_ref().service;
        if !known(service) {
            return Err(Status::not_found(format!(
                "no service '{}' here: ask for \"\" (the server) or '{INFERENCE_SERVICE}'",
                sheaf_core::clip(service)
            )));
        }
        Ok(Response::new(answer(serving(&self.state).await)))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        allow(&self.state, request.metadata(), Api::Health, Scope::Open)?;
        let known = known(&request.get_ref().service);
        let state = self.state.clone();
        // The state of the stream: the status last sent, or `None` once it has ended.
        let sent: Option<Option<ServingStatus>> = Some(None);
        let stream = futures::stream::unfold(sent, move |sent| {
            let state = state.clone();
            async move {
                let last = sent?;
                loop {
                    let now = if known {
                        serving(&state).await
                    } else {
                        ServingStatus::ServiceUnknown
                    };
                    let draining = state.drain.is_draining();
                    if last != Some(now) {
                        let next = (!draining).then_some(Some(now));
                        return Some((Ok(answer(now)), next));
                    }
                    if draining {
                        return None;
                    }
                    tokio::select! {
                        () = state.drain.announced() => {}
                        () = tokio::time::sleep(WATCH_EVERY) => {}
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
