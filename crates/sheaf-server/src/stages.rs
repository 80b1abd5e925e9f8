//! Closes each answer's account of stages (see [`sheaf_core::stages`]) when its last byte is
//! written, for HTTP and gRPC alike.
//!
//! [`account`] is the outermost layer of both routers: it notes when a request arrives (its
//! headers read, its body not yet), and when the handler's response carries a
//! [`Receipt`] in its extensions, wraps the response body so that the receipt is closed when the
//! connection has taken the whole body and drops it.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use sheaf_core::stages::Receipt;
use tokio::time::Instant;

/// The middleware: see the module doc.
pub async fn account(request: Request, next: Next) -> Response {
    let arrival = Instant::now();
    let mut response = next.run(request).await;
    match response.extensions_mut().remove::<Receipt>() {
        Some(receipt) => response.map(|body| {
            Body::new(Timed {
                body,
                open: Some((receipt, arrival)),
            })
        }),
        None => response,
    }
}

/// A response body that closes its receipt once written (when the connection drops it).
struct Timed {
    body: Body,
    open: Option<(Receipt, Instant)>,
}

impl http_body::Body for Timed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        if let Some((receipt, arrival)) = self.open.take() {
            receipt.sent(arrival);
        }
    }
}
