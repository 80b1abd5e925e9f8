//! Accepting connections under limits, for the HTTP and the gRPC servers.
//!
//! - At most [`ConnectionLimits::max_connections`] connections are open on a port at once;
//!   past that, new ones wait in the kernel's backlog until one closes, so a crowd of idle or
//!   slow clients cannot take the file descriptors that others need.
//! - Every connection gets `TCP_NODELAY`, so small answers are not held back by Nagle's
//!   algorithm against a client's delayed ACK.
//! - Over HTTP/1, a client must send a request's headers within
//!   [`ConnectionLimits::header_timeout`] (which also closes a keep-alive connection idle that
//!   long), and its body within [`ConnectionLimits::body_timeout`] (408 otherwise).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long clients may take, and how many may be connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once on one port.
    pub max_connections: usize,
    /// Time a client has to send a request's headers (HTTP/1).
    pub header_timeout: Duration,
    /// Time a client has to send a request's body (HTTP).
    pub body_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
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
}

/// A connection that holds its permit until it is dropped.
pub struct Counted {
    tcp: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl Counted {
    pub fn new(tcp: TcpStream, permit: OwnedSemaphorePermit) -> Counted {
        Counted {
            tcp,
            _permit: permit,
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Counted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tcp.connect_info()
    }
}
