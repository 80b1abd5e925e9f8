//! Accepting and serving connections under limits, for the HTTP, metrics and gRPC ports.
//!
//! - At most [`ConnectionLimits::max_connections`] connections are open on a port at once;
//!   past that, new ones wait in the kernel's backlog until one closes, so a crowd of idle or
//!   slow clients cannot take the file descriptors that others need.
//! - Every connection gets `TCP_NODELAY`, so small answers are not held back by Nagle's
//!   algorithm against a client's delayed ACK.
//! - Over HTTP/1, a client must send a request's headers within
//!   [`ConnectionLimits::header_timeout`] (which also closes a keep-alive connection idle that
//!   long), and its body within [`ConnectionLimits::body_timeout`] (408 otherwise). A TLS
//!   handshake has the header timeout to complete.
//! - Once the [`Drain`] is announced, each connection tells its client to go elsewhere after
//!   the answer it is on: an HTTP/1.1 answer carries `Connection: close` (the client reads it
//!   before it could send again, so no request is written into a closing socket), and an
//!   HTTP/2 connection (HTTP or gRPC) gets a GOAWAY, after which its open streams finish. An
//!   HTTP/1 connection that sends nothing during the drain is closed when the listener closes.
//! - With [`ConnectionLimits::max_age`] (gRPC's `max_connection_age`: Triton's
//!   `--grpc-max-connection-age`), a connection open that long gets a GOAWAY, so that clients
//!   reconnect and new servers behind a load balancer take their share; one still open its
//!   grace later is closed.
//! - When `shutdown` resolves, the connections already waiting in the kernel's backlog are
//!   taken and served (during the drain they are answered 503 with `Retry-After`), so that
//!   closing the listener resets none of them; then the listener closes, every connection
//!   finishes the request it is on and closes, and [`serve_connections`] returns when the last
//!   one has. A connection that has not yet sent a request (one from the backlog, or one
//!   accepted just before) has [`FIRST_REQUEST_GRACE`] to send it and is closed once it is
//!   answered: closed unread, its request would come back to its client as a reset.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderValue, Request, Version};
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use crate::drain::Drain;
use crate::tls::HttpTls;

/// How long clients may take, and how many may be connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once on one port.
    pub max_connections: usize,
    /// Time a client has to send a request's headers (HTTP/1).
    pub header_timeout: Duration,
    /// Time a client has to send a request's body (HTTP).
    pub body_timeout: Duration,
    /// HTTP/2 keepalive pings on each connection (gRPC's keepalive: Triton's
    /// `--grpc-keepalive-time` and `--grpc-keepalive-timeout`); none: no pings.
    pub keepalive: Option<Keepalive>,
    /// How long a connection may stay open before it is told to go away, and how long it then
    /// has before it is closed (none: until its streams end).
    pub max_age: Option<(Duration, Option<Duration>)>,
}

/// The server pings each HTTP/2 connection every `every` it is open, and closes it when a ping
/// is not answered within `timeout`: a client or load balancer that went away is let go, and an
/// idle connection a middlebox would drop is kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub every: Duration,
    pub timeout: Duration,
}

impl Keepalive {
    /// Sets these pings on `builder`'s HTTP/2 connections.
    pub fn apply<E>(self, builder: &mut hyper_util::server::conn::auto::Http2Builder<'_, E>) {
        builder
            .keep_alive_interval(Some(self.every))
            .keep_alive_timeout(self.timeout);
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            keepalive: None,
            max_age: None,
        }
    }
}

/// Accepts connections from `listener`, at most `max` open at once. Each comes with the permit
/// that counts it, to be dropped when the connection ends.
pub struct Acceptor {
    listener: TcpListener,
    permits: Arc<Semaphore>,
}

impl Acceptor {
    pub fn new(listener: TcpListener, max: usize) -> Acceptor {
        Acceptor {
            listener,
            permits: Arc::new(Semaphore::new(max.max(1))),
        }
    }

    /// The next connection, once there is room for it.
    pub async fn accept(&self) -> (TcpStream, OwnedSemaphorePermit) {
        loop {
            // The semaphore is never closed, so acquiring fails only if it were.
            let Ok(permit) = self.permits.clone().acquire_owned().await else {
                std::future::pending::<()>().await;
                continue;
            };
            match self.listener.accept().await {
                Ok((tcp, _)) => {
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!("cannot set TCP_NODELAY: {e}");
                    }
                    return (tcp, permit);
                }
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was taken:
                    // wait a little rather than spin.
                    tracing::warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Closes the listener, first taking every connection already waiting in the kernel's
    /// backlog (closing a listener resets those): each with a permit where one is free.
    pub fn close(self) -> Vec<(TcpStream, Option<OwnedSemaphorePermit>)> {
        let mut waiting = Vec::new();
        let Ok(listener) = self.listener.into_std() else {
            return waiting;
        };
        while let Ok((tcp, _)) = listener.accept() {
            let tcp = tcp
                .set_nonblocking(true)
                .and_then(|()| TcpStream::from_std(tcp));
            match tcp {
                Ok(tcp) => {
                    let _ = tcp.set_nodelay(true);
                    waiting.push((tcp, self.permits.clone().try_acquire_owned().ok()));
                }
                Err(e) => tracing::debug!("cannot take a waiting connection: {e}"),
            }
        }
        waiting
    }
}

/// Serves `router` on each connection that `listener` accepts, under `limits`, over TLS when
/// `tls` is given, with hyper's `builder` (HTTP/1 and HTTP/2, or HTTP/2 alone for gRPC), until
/// `shutdown` resolves; then closes the listener and waits for every connection to finish the
/// request it is on. `drain` tells connections when to send their clients elsewhere.
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    builder: auto::Builder<TokioExecutor>,
    limits: ConnectionLimits,
    tls: Option<HttpTls>,
    drain: Arc<Drain>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let acceptor = Acceptor::new(listener, limits.max_connections);
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    // Each connection holds a receiver: the sender's `closed` resolves when the last has ended.
    let closing = watch::Sender::new(false);
    tokio::pin!(shutdown);
    let serve =
        |tcp: TcpStream, permit: Option<OwnedSemaphorePermit>, closing: watch::Receiver<bool>| {
            let (builder, tls) = (builder.clone(), tls.clone());
            let served = Served {
                inner: TowerToHyperService::new(router.clone()),
                drain: drain.clone(),
                seen: Arc::new(Seen::default()),
            };
            tokio::spawn(async move {
                let max_age = limits.max_age;
                let ended = match tls {
                    None => serve_connection(tcp, builder, served, closing, max_age).await,
                    Some(tls) => {
                        match tokio::time::timeout(limits.header_timeout, tls.accept(tcp)).await {
                            Ok(Ok(stream)) => {
                                serve_connection(stream, builder, served, closing, max_age).await
                            }
                            Ok(Err(e)) => Err(format!("TLS handshake failed: {e}").into()),
                            Err(_) => Err("TLS handshake timed out".into()),
                        }
                    }
                };
                if let Err(e) = ended {
                    tracing::debug!("connection ended: {e}");
                }
                drop(permit);
            });
        };
    loop {
        let (tcp, permit) = tokio::select! {
            accepted = acceptor.accept() => accepted,
            () = &mut shutdown => break,
        };
        serve(tcp, Some(permit), closing.subscribe());
    }
    // The connections that were waiting are served like the others: each has its grace to
    // send its first request.
    for (tcp, permit) in acceptor.close() {
        serve(tcp, permit, closing.subscribe());
    }
    closing.send_replace(true);
    closing.closed().await;
}

/// How long a connection that has sent no request yet when the listener closes has to send
/// its first.
const FIRST_REQUEST_GRACE: Duration = Duration::from_millis(500);

type ConnectionError = Box<dyn std::error::Error + Send + Sync>;

/// One connection, from its first byte to its close: told to go away once the drain is
/// announced (HTTP/2), when the server closes (every protocol), or at its `max_age` (then
/// closed after the age's grace, if one is given).
async fn serve_connection<I>(
    io: I,
    builder: auto::Builder<TokioExecutor>,
    served: Served,
    mut closing: watch::Receiver<bool>,
    max_age: Option<(Duration, Option<Duration>)>,
) -> Result<(), ConnectionError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (drain, seen) = (served.drain.clone(), served.seen.clone());
    let connection = builder
        .serve_connection_with_upgrades(TokioIo::new(io), served)
        .into_owned();
    tokio::pin!(connection);
    // HTTP/2 gets its GOAWAY as soon as the drain is announced and the connection is known
    // to speak HTTP/2 (from its first request); HTTP/1 answers carry `Connection: close`.
    let go_away = async {
        drain.announced().await;
        if !seen.http2.load(Ordering::Acquire) {
            seen.http2_draining.notified().await;
        }
    };
    let close = closing.wait_for(|&close| close);
    // At close, a connection that has sent no request yet waits for its first (or the grace).
    let first_request = seen.first_request.notified();
    let grace = tokio::time::sleep(FIRST_REQUEST_GRACE);
    // Far enough to never come when there is no age; reset to the age's grace once it has.
    let far = Duration::from_secs(100 * 365 * 24 * 3600);
    let (age, age_grace) = max_age.unwrap_or((far, None));
    let aged = tokio::time::sleep(age);
    let expired = tokio::time::sleep(far);
    tokio::pin!(go_away, close, first_request, grace, aged, expired);
    let (mut told, mut waiting, mut old) = (false, false, false);
    loop {
        let tell = tokio::select! {
            ended = connection.as_mut() => return ended,
            () = &mut expired, if old => return Ok(()),
            () = &mut aged, if !old => {
                old = true;
                if let Some(grace) = age_grace {
                    expired.as_mut().reset(tokio::time::Instant::now() + grace);
                }
                !told
            }
            () = &mut go_away, if !told => true,
            _ = &mut close, if !told && !waiting => {
                waiting = !seen.requested.load(Ordering::Acquire);
                grace
                    .as_mut()
                    .reset(tokio::time::Instant::now() + FIRST_REQUEST_GRACE);
                !waiting
            }
            () = &mut first_request, if waiting && !told => true,
            () = &mut grace, if waiting && !told => true,
        };
        if tell {
            // Ends the connection after the request it is on, if any.
            connection.as_mut().graceful_shutdown();
            told = true;
        }
    }
}

/// What a connection's requests have shown of it.
#[derive(Debug, Default)]
struct Seen {
    /// A request came.
    requested: AtomicBool,
    /// Notified when the first request comes.
    first_request: Notify,
    /// A request came over HTTP/2.
    http2: AtomicBool,
    /// Notified when an HTTP/2 request is answered during the drain.
    http2_draining: Notify,
}

/// The routes, as one connection serves them: answers given during a drain tell the client to
/// reconnect (elsewhere) for its next request.
#[derive(Clone)]
struct Served {
    inner: TowerToHyperService<Router>,
    drain: Arc<Drain>,
    seen: Arc<Seen>,
}

impl hyper::service::Service<Request<Incoming>> for Served {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        if !self.seen.requested.swap(true, Ordering::AcqRel) {
            self.seen.first_request.notify_one();
        }
        let http2 = request.version() == Version::HTTP_2;
        if http2 {
            self.seen.http2.store(true, Ordering::Release);
        }
        let answer = hyper::service::Service::call(&self.inner, request);
        let (drain, seen) = (self.drain.clone(), self.seen.clone());
        Box::pin(async move {
            let mut response = answer.await?;
            if drain.is_draining() {
                if http2 {
                    seen.http2_draining.notify_one();
                } else {
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
            }
            Ok(response)
        })
    }
}
