//! `sheaf bench` against two KServe v2 servers (two sheaf processes: one over HTTP, one over
//! gRPC), writing JSON, CSV and an SVG plot.

mod common;

use common::{demo_mlp, sheaf, Server};

// The tests serve the demo's MLP alone, with its config: the model they measure, without the
// rest of the demo repository to load first.

#[test]
fn bench_drives_two_servers_and_writes_its_reports() {
    let repo = demo_mlp();
    let (a, b) = (Server::start(repo.path()), Server::start(repo.path()));
    let out = tempfile::tempdir().unwrap();
    let (json, csv, svg) = (
        out.path().join("r.json"),
        out.path().join("r.csv"),
        out.path().join("r.svg"),
    );

    let run = sheaf()
        .args([
            "bench",
            "--model",
            "mlp",
            "--concurrency",
            "1,4",
            "--requests",
            "40",
        ])
        .arg("--url")
        .arg(format!("http://{}", a.http))
        .arg("--json")
        .arg(&json)
        .arg("--csv")
        .arg(&csv)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    succeeded(&run);
    let levels: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let levels = levels.as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for (level, c) in levels.iter().zip([1.0, 4.0]) {
        assert_eq!(level["mode"], "concurrency");
        assert_eq!(level["level"], c);
        assert_eq!(level["requests"], 40);
        assert_eq!(level["errors"], 0);
        assert!(level["p99_ms"].as_f64().unwrap() >= level["p50_ms"].as_f64().unwrap());
        assert!(
            level["server_compute_ms"].as_f64().unwrap() > 0.0,
            "server-side split read from /stats"
        );
    }
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv.lines().count(), 3);
    assert!(csv.starts_with("mode,level,requests,errors"));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("p99") && svg.contains("throughput"));

    // The second server over gRPC, in open-loop modes; errors are reported by kind.
    let grpc = sheaf()
        .args([
            "bench",
            "--model",
            "mlp",
            "--protocol",
            "grpc",
            "--users",
            "3",
            "--requests-per-user",
            "4",
        ])
        .arg("--url")
        .arg(format!("http://{}", b.grpc))
        .arg("--http-url")
        .arg(format!("http://{}", b.http))
        .output()
        .unwrap();
    let stdout = succeeded(&grpc);
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("users"))
        .expect("a users row");
    assert!(row.trim_end().ends_with(" 0"), "no errors: {row}");
    let stats: serde_json::Value = reqwest_get(&format!("http://{}/v2/models/mlp/stats", b.http));
    assert_eq!(
        stats["model_stats"][0]["inference_count"], 12,
        "the second server saw all 12 requests"
    );

    // Open loops past what the client keeps in flight: a burst larger than its places, and a
    // rate no client could send, each slow down to --max-outstanding instead of opening
    // connections without end, and say how many requests waited.
    let open_loop = |pattern: &[&str]| -> serde_json::Value {
        let json = out.path().join("open.json");
        let mut run = sheaf()
            .args(["bench", "--model", "mlp", "--max-outstanding", "4"])
            .args(pattern)
            .arg("--url")
            .arg(format!("http://{}", a.http))
            .arg("--json")
            .arg(&json)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while run.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                run.kill().unwrap();
                panic!("{pattern:?} did not finish");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let stdout = succeeded(&run.wait_with_output().unwrap());
        assert!(stdout.contains("ran behind its schedule"), "{stdout}");
        let levels: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(levels[0]["errors"], 0, "{levels}");
        levels[0].clone()
    };
    let burst = open_loop(&["--burst", "40"]);
    assert_eq!(burst["requests"], 40);
    assert!(
        (1..=36).contains(&burst["waited"].as_u64().unwrap()),
        "{burst}"
    );
    // Every request of the burst arrived at its start, so the last one answered is timed from
    // there: its latency is most of the level's time, not one request's.
    let (max_ms, seconds) = (
        burst["max_ms"].as_f64().unwrap(),
        burst["seconds"].as_f64().unwrap(),
    );
    assert!(max_ms >= 0.5 * seconds * 1e3, "{burst}");
    let rate = open_loop(&["--request-rate", "1e12", "--duration", "1"]);
    assert_eq!(rate["mode"], "rate");
    assert!(rate["waited"].as_u64().unwrap() >= 1, "{rate}");

    let missing = sheaf()
        .args(["bench", "--model", "nope", "--burst", "3"])
        .arg("--url")
        .arg(format!("http://{}", a.http))
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("404"));
}

/// The standard output of a `sheaf` run that must have succeeded (else both outputs, in the
/// failure).
fn succeeded(run: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    stdout
}

fn reqwest_get(url: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap()
}

#[test]
fn the_in_process_reference_is_measured_before_and_again_after_the_levels() {
    let repo = demo_mlp();
    let server = Server::start(repo.path());
    let run = sheaf()
        .args(["bench", "--model", "mlp", "--concurrency", "1,2"])
        .args(["--duration", "0.3", "--batch-sizes", "1,4"])
        .arg("--in-process")
        .arg(repo.path().join("mlp/1/model.onnx"))
        .arg("--url")
        .arg(format!("http://{}", server.http))
        .output()
        .unwrap();
    let stdout = succeeded(&run);
    let best = stdout
        .lines()
        .find_map(|l| l.strip_prefix("in-process best: "))
        .expect("the in-process curve's best");
    let batch = best.rsplit(' ').next().unwrap();
    assert_eq!(stdout.matches("served/in-process:").count(), 2, "{stdout}");
    // After both levels, the loop at the best batch size once more, and how far it moved.
    let (levels, after) = stdout.split_once("again after the levels").expect(&stdout);
    assert!(levels.contains("concurrency        2"), "{stdout}");
    assert!(
        levels
            .lines()
            .last()
            .unwrap()
            .starts_with(&format!("in-process at batch {batch}")),
        "{stdout}"
    );
    let change: f64 = after
        .split_once('(')
        .and_then(|(_, r)| r.split_once('%'))
        .and_then(|(n, _)| n.parse().ok())
        .expect(after);
    assert!(change > -100.0, "{after}");
}
