//! The server-wide bound on the bytes of requests held in memory (`--max-request-memory`).
//!
//! Each request's bytes stay in memory from its arrival until its answer has been sent: while
//! its body arrives, while it waits in a model's queue, and while its batch runs (a binary
//! tensor is a slice of the body it came in). Without a bound, a crowd of clients sending
//! large bodies at once (up to `--max-connections` of `--max-body-bytes` each) could take more
//! memory than the host has, and the kernel would end the process with every request it held.
//! With one, the request that would pass it is refused at once with 503 and `Retry-After`
//! (gRPC: `RESOURCE_EXHAUSTED`, `retry-after` metadata), as a full queue is, and the server
//! keeps serving the others.
//!
//! Over HTTP, a body's declared `Content-Length` is [`RequestMemory::hold`] before any of it is
//! read, a body sent without one (chunked) holds more as each piece arrives
//! ([`Held::grow`]), and a compressed body holds its inflated size too; the hold ends when the
//! response body has been sent (see [`crate::http::gate`]). The KServe infer route holds the
//! tensors it decodes from JSON as well, while the request runs. Over gRPC, each message (every
//! message of a stream on its own) holds its declared length while it arrives (see
//! `grpc::receiving`), and its encoded size once tonic has decoded it, until its answer is
//! written; a KServe request's numeric typed contents (`int64_contents`…) count at their
//! decoded size besides (a zero is one byte on the wire and eight as an INT64). A Vertex AI
//! prediction redirected to the main API passes two gates and is counted once.
//!
//! `/metrics` shows the bytes held, the bound and the requests refused ([`RequestMemory::render`]).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// The bytes of requests held now, and the most that may be.
#[derive(Debug)]
pub struct RequestMemory {
    limit: usize,
    held: AtomicUsize,
    refused: AtomicU64,
}

impl Default for RequestMemory {
    /// No bound.
    fn default() -> Self {
        RequestMemory::new(usize::MAX)
    }
}

/// A request's share of [`RequestMemory`], given back when dropped.
#[derive(Debug)]
pub struct Held {
    memory: Arc<RequestMemory>,
    bytes: usize,
}

/// Why a request was refused: what was held, what it asked for, and the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub held: usize,
    pub asked: usize,
    pub limit: usize,
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server is holding {} bytes of requests, and this one's {} would pass its limit \
             of {} (--max-request-memory); retry shortly",
            self.held, self.asked, self.limit
        )
    }
}

impl RequestMemory {
    /// A bound of `limit` bytes.
    pub fn new(limit: usize) -> RequestMemory {
        RequestMemory {
            limit,
            held: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// The most bytes of requests held at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes of requests held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Holds `bytes` for a request, or says why not when they would pass the limit.
    pub fn hold(self: &Arc<Self>, bytes: usize) -> Result<Held, Full> {
        let mut held = self.nothing();
        held.grow(bytes)?;
        Ok(held)
    }

    /// A hold of no bytes yet, for a request whose size is learnt as it arrives.
    pub fn nothing(self: &Arc<Self>) -> Held {
        Held {
            memory: self.clone(),
            bytes: 0,
        }
    }

    fn take(&self, bytes: usize) -> Result<(), Full> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .map(drop)
            .map_err(|held| {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Full {
                    held,
                    asked: bytes,
                    limit: self.limit,
                }
            })
    }

    /// Appends the bytes held, the bound and the requests refused to `out`, in Prometheus's
    /// text format.
    pub fn render(&self, out: &mut String) {
        let series: [(&str, &str, &str, u64); 3] = [
            (
                "sheaf_request_memory_bytes",
                "gauge",
                "Bytes of requests held in memory now, from arrival until the answer is sent",
                self.held() as u64,
            ),
            (
                "sheaf_request_memory_limit_bytes",
                "gauge",
                "Most bytes of requests held at once (--max-request-memory)",
                self.limit as u64,
            ),
            (
                "sheaf_request_memory_refused_total",
                "counter",
                "Requests refused because their bytes would pass --max-request-memory",
                self.refused.load(Ordering::Relaxed),
            ),
        ];
        for (name, kind, help, value) in series {
            // Writing into a String cannot fail.
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            );
        }
    }
}

impl Held {
    /// Holds `more` bytes for the same request.
    pub fn grow(&mut self, more: usize) -> Result<(), Full> {
        self.memory.take(more)?;
        self.bytes += more;
        Ok(())
    }

    /// Holds `bytes` in all, when that is more than is held already.
    pub fn grow_to(&mut self, bytes: usize) -> Result<(), Full> {
        match bytes.checked_sub(self.bytes) {
            Some(more) if more > 0 => self.grow(more),
            _ => Ok(()),
        }
    }

    /// Counts `bytes` in all, when that is more than is held already, even past the limit:
    /// for bytes that are in memory whatever is decided, so that others are refused.
    pub fn count_to(&mut self, bytes: usize) {
        if let Some(more) = bytes.checked_sub(self.bytes) {
            self.memory.held.fetch_add(more, Ordering::AcqRel);
            self.bytes = bytes;
        }
    }

    /// Gives back what is held past `bytes`.
    pub fn shrink_to(&mut self, bytes: usize) {
        if let Some(extra) = self.bytes.checked_sub(bytes) {
            self.memory.held.fetch_sub(extra, Ordering::AcqRel);
            self.bytes = bytes;
        }
    }

    /// Bytes this request holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_bounded_and_given_back() {
        let memory = Arc::new(RequestMemory::new(100));
        let a = memory.hold(60).unwrap();
        let refused = memory.hold(41).unwrap_err();
        assert_eq!(
            refused,
            Full {
                held: 60,
                asked: 41,
                limit: 100
            }
        );
        assert!(refused.to_string().contains("--max-request-memory"));
        let mut text = String::new();
        memory.render(&mut text);
        for line in [
            "sheaf_request_memory_bytes 60\n",
            "sheaf_request_memory_limit_bytes 100\n",
            "# TYPE sheaf_request_memory_refused_total counter\nsheaf_request_memory_refused_total 1\n",
        ] {
            assert!(text.contains(line), "{text}");
        }
        let mut b = memory.hold(40).unwrap();
        assert_eq!(memory.held(), 100);
        assert!(b.grow(1).is_err(), "a hold that grows is bounded too");
        assert_eq!(b.bytes(), 40);
        drop(a);
        b.grow_to(70).unwrap();
        b.grow_to(10).unwrap();
        assert_eq!((b.bytes(), memory.held()), (70, 70));
        drop(b);
        assert_eq!(memory.held(), 0);
        // A sum past what a number holds is refused, not wrapped.
        let unbounded = Arc::new(RequestMemory::default());
        let _most = unbounded.hold(usize::MAX - 1).unwrap();
        assert!(unbounded.hold(2).is_err());
    }
}
