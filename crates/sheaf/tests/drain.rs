//! A SIGTERM under load, as Kubernetes sends it: the real `sheaf serve` with `--drain-delay`,
//! clients that keep HTTP/1.1 connections alive, clients that open a connection per request,
//! gRPC clients (tonic), and a readiness poller standing in for the endpoints controller. The
//! clients stop sending a moment after the poller sees readiness fail, as traffic routed by a
//! load balancer does. Every request must get an answer: no connection reset, no request
//! written into a closing socket, no connection refused while clients are still routed here,
//! and a connection still waiting in the kernel's backlog when the listener closes is answered.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{mlp_repository, Server};

/// What happened to one request.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// An HTTP status (or gRPC code 0 as 200), whether the answer said `Connection: close`,
    /// and for a 503 whether it carried `Retry-After`.
    Answered {
        status: u16,
        close: bool,
        retry_after: bool,
    },
    /// The connection was refused.
    Refused,
    /// The request could not be written.
    SendFailed(String),
    /// The connection broke before the answer was read.
    Broken(String),
    /// A gRPC error.
    Grpc(String),
}

/// Every request a client sent: when it was sent, when it ended, and what came of it.
type Log = Arc<Mutex<Vec<(Instant, Instant, Outcome)>>>;

fn body() -> String {
    format!(
        "{{\"inputs\":[{{\"name\":\"input\",\"shape\":[1,512],\"datatype\":\"FP32\",\"data\":[{}]}}]}}",
        vec!["0.25"; 512].join(",")
    )
}

/// Reads one HTTP/1.1 answer: status, `Connection: close`, `Retry-After`.
fn read_answer(reader: &mut BufReader<TcpStream>) -> Result<(u16, bool, bool), String> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => return Err("closed before an answer".into()),
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    let status = line
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or(format!("not a status line: {line:?}"))?;
    let (mut length, mut close, mut retry_after) = (0usize, false, false);
    loop {
        line.clear();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        let Some((name, value)) = line.trim_end().split_once(": ") else {
            break;
        };
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().map_err(|_| "bad length")?,
            "connection" => close = value.eq_ignore_ascii_case("close"),
            "retry-after" => retry_after = true,
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).map_err(|e| e.to_string())?;
    Ok((status, close, retry_after))
}

/// Sends inference requests until `stop`, reusing its connection until an answer says to close
/// it (`keep_alive`), or on a new connection each time.
fn client(address: String, keep_alive: bool, stop: Arc<AtomicBool>, log: Log) {
    let body = body();
    let mut open: Option<BufReader<TcpStream>> = None;
    while !stop.load(Ordering::Acquire) {
        let sent = Instant::now();
        let outcome = (|| {
            let reader = match open.as_mut() {
                Some(reader) => reader,
                None => match TcpStream::connect(&address) {
                    Ok(tcp) => open.insert(BufReader::new(tcp)),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        return Outcome::Refused
                    }
                    Err(e) => return Outcome::Broken(format!("connect: {e}")),
                },
            };
            let close = if keep_alive {
                ""
            } else {
                "Connection: close\r\n"
            };
            let request = format!(
                "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n{close}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = reader.get_mut().write_all(request.as_bytes()) {
                return Outcome::SendFailed(e.to_string());
            }
            match read_answer(reader) {
                Ok((status, close, retry_after)) => Outcome::Answered {
                    status,
                    close,
                    retry_after,
                },
                Err(e) => Outcome::Broken(e),
            }
        })();
        let reuse = keep_alive && matches!(outcome, Outcome::Answered { close: false, .. });
        if !reuse {
            open = None;
        }
        log.lock().unwrap().push((sent, Instant::now(), outcome));
    }
}

/// Calls `ModelInfer` over one tonic channel until `stop`.
fn grpc_client(address: String, stop: Arc<AtomicBool>, log: Log) {
    use sheaf_server::grpc::pb;
    use sheaf_server::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut c = GrpcInferenceServiceClient::connect(format!("http://{address}"))
            .await
            .unwrap();
        let data: Vec<u8> = [0.25f32; 512]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        while !stop.load(Ordering::Acquire) {
            let request = pb::ModelInferRequest {
                model_name: "mlp".into(),
                inputs: vec![pb::model_infer_request::InferInputTensor {
                    name: "input".into(),
                    datatype: "FP32".into(),
                    shape: vec![1, 512],
                    ..Default::default()
                }],
                raw_input_contents: vec![data.clone().into()],
                ..Default::default()
            };
            let sent = Instant::now();
            // A call that its connection's GOAWAY overtook never reached the server: gRPC's
            // own clients (grpc-core under tritonclient, grpc-go, grpc-java) resend it by
            // themselves ("transparent retry"); tonic does not, so this client does, once.
            let mut answer = c.model_infer(request.clone()).await;
            if answer.as_ref().is_err_and(never_sent) {
                answer = c.model_infer(request).await;
            }
            let outcome = match answer {
                Ok(_) => Outcome::Answered {
                    status: 200,
                    close: false,
                    retry_after: false,
                },
                Err(e)
                    if e.code() == tonic::Code::Unavailable
                        && e.metadata().get("retry-after").is_some() =>
                {
                    Outcome::Answered {
                        status: 503,
                        close: false,
                        retry_after: true,
                    }
                }
                Err(e) => Outcome::Grpc(format!("{e:?}")),
            };
            log.lock().unwrap().push((sent, Instant::now(), outcome));
        }
    });
}

/// True for a call that hyper cancelled before it was written: its connection had closed.
fn never_sent(status: &tonic::Status) -> bool {
    use std::error::Error;
    let mut source = status.source();
    while let Some(e) = source {
        if let Some(e) = e.downcast_ref::<hyper::Error>() {
            return e.is_canceled();
        }
        source = e.source();
    }
    false
}

/// Polls readiness on a new connection every 10 ms until the listener closes, noting in
/// `unready` when it first saw 503; the time the listener refused it, and anything else that
/// went wrong.
fn poll_readiness(address: String, unready: Arc<Mutex<Option<Instant>>>) -> (Instant, Vec<String>) {
    let mut problems = Vec::new();
    loop {
        let at = Instant::now();
        match TcpStream::connect(&address) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return (at, problems),
            Err(e) => problems.push(format!("connect: {e}")),
            Ok(mut tcp) => {
                let sent = tcp.write_all(
                    b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                );
                let answer = sent
                    .map_err(|e| e.to_string())
                    .and_then(|()| read_answer(&mut BufReader::new(tcp)));
                match answer {
                    // Seen when the answer came: a probe sent just before the signal may be
                    // answered after it, rightly with a 503.
                    Ok((503, _, _)) => {
                        unready.lock().unwrap().get_or_insert_with(Instant::now);
                    }
                    Ok((200, _, _)) if unready.lock().unwrap().is_none() => {}
                    other => problems.push(format!("readiness: {other:?}")),
                }
            }
        }
        assert!(
            at.elapsed() < Duration::from_secs(60),
            "the listener never closed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sigterm_under_load_turns_unready_first_and_every_request_is_answered() {
    let repo = mlp_repository(None);
    let delay = Duration::from_secs(2);
    let mut server = Server::start_with(repo.path(), &["--drain-delay", "2"]);
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    let mut logs: Vec<(&str, Log)> = Vec::new();
    for (kind, n) in [("keep-alive", 4), ("per-request", 4), ("grpc", 2)] {
        for _ in 0..n {
            let log = Log::default();
            logs.push((kind, log.clone()));
            let stop = stop.clone();
            let (http, grpc) = (server.http.clone(), server.grpc.clone());
            clients.push(std::thread::spawn(move || match kind {
                "keep-alive" => client(http, true, stop, log),
                "per-request" => client(http, false, stop, log),
                _ => grpc_client(grpc, stop, log),
            }));
        }
    }
    let address = server.http.clone();
    let unready = Arc::new(Mutex::new(None));
    let seen = unready.clone();
    let poller = std::thread::spawn(move || poll_readiness(address, seen));
    std::thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    server.signal_term();
    // The endpoints controller sees readiness fail, and traffic stops a moment later.
    let lag = Duration::from_millis(300);
    let unready = loop {
        if let Some(at) = *unready.lock().unwrap() {
            break at;
        }
        assert!(
            signalled.elapsed() < delay,
            "readiness was not seen as 503 within the drain delay"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    std::thread::sleep(lag);
    stop.store(true, Ordering::Release);
    for c in clients {
        c.join().unwrap();
    }
    let status = server.wait();
    let (closed, problems) = poller.join().unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(problems.is_empty(), "{problems:?}");
    assert!(unready >= signalled, "readiness failed before the signal");
    // Readiness failed before the listener closed, which waited out the drain delay.
    assert!(
        closed.duration_since(signalled) >= delay,
        "the listener closed {:?} after the signal, within the drain delay",
        closed.duration_since(signalled)
    );
    for (kind, log) in &logs {
        let log = log.lock().unwrap();
        let bad: Vec<_> = log
            .iter()
            .filter(|(_, _, o)| {
                !matches!(
                    o,
                    Outcome::Answered { status: 200, .. }
                        | Outcome::Answered {
                            status: 503,
                            retry_after: true,
                            ..
                        }
                )
            })
            .collect();
        assert!(bad.is_empty(), "{kind}: {bad:?}");
        let during: Vec<_> = log.iter().filter(|(at, _, _)| *at > signalled).collect();
        assert!(
            during
                .iter()
                .any(|(_, _, o)| matches!(o, Outcome::Answered { status: 200, .. })),
            "{kind}: nothing was served during the drain delay"
        );
        if *kind == "keep-alive" {
            assert!(
                during
                    .iter()
                    .any(|(_, _, o)| matches!(o, Outcome::Answered { close: true, .. })),
                "{kind}: no answer during the drain said Connection: close"
            );
            let before = log.iter().filter(|(_, done, _)| *done < signalled);
            assert!(
                !before
                    .clone()
                    .any(|(_, _, o)| matches!(o, Outcome::Answered { close: true, .. })),
                "connections were closed before the drain"
            );
            assert!(before.count() > 1, "{kind}: no load before the signal");
        }
    }
}

#[test]
fn connections_waiting_in_the_backlog_at_close_are_answered_not_reset() {
    let repo = mlp_repository(None);
    // One connection at a time: the second waits in the kernel's backlog, unaccepted.
    let mut server = Server::start_with(
        repo.path(),
        &["--drain-delay", "0", "--max-connections", "1"],
    );
    let ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut held = TcpStream::connect(&server.http).unwrap();
    held.write_all(ready).unwrap();
    let mut held = BufReader::new(held);
    assert_eq!(read_answer(&mut held).unwrap().0, 200);
    let mut waiting = TcpStream::connect(&server.http).unwrap();
    waiting.write_all(ready).unwrap();
    waiting
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    server.signal_term();
    // Taken from the backlog as the listener closes, and answered: the server is draining.
    let answer = read_answer(&mut BufReader::new(waiting));
    assert!(
        matches!(answer, Ok((503, true, _))),
        "the waiting connection got {answer:?}"
    );
    assert!(server.wait().success());
}
