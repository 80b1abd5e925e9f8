//! `bench/gpu.sh --device cpu`: the GPU measurement, run on the CPU, produces its whole table
//! (in-process three ways, served over HTTP and gRPC with the stages per level, memory per model,
//! SIGTERM exits), and every shutdown exits 0.

mod common;

use common::root;

#[test]
fn the_gpu_benchmark_runs_on_the_cpu_and_writes_its_whole_table() {
    let out = tempfile::tempdir().unwrap();
    let table = out.path().join("table.md");
    let run = std::process::Command::new("bash")
        .arg(root().join("bench/gpu.sh"))
        .args([
            "--device",
            "cpu",
            "--seconds",
            "0.3",
            "--levels",
            "1,4",
            "--exits",
            "3",
        ])
        .arg("--out")
        .arg(&table)
        .env("SHEAF_BIN", env!("CARGO_BIN_EXE_sheaf"))
        .env("SHEAF_BENCH_PORT", "18731")
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "{log}");
    let text = std::fs::read_to_string(&table).unwrap();
    for section in [
        "### In-process, items/s by batch size",
        "### Served, one item a request",
        "### Memory on the device",
        "### SIGTERM exits",
    ] {
        assert!(text.contains(section), "{section} missing:\n{text}");
    }
    let rows = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
    for model in ["nsfw", "efficientnet", "faces", "mlp"] {
        for protocol in ["http", "grpc"] {
            assert_eq!(
                rows(&format!("| {model} | {protocol} | ")),
                2,
                "{model} {protocol}:\n{text}"
            );
        }
        // Every in-process row has the plain loop and sheaf bench's figure.
        let in_process: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("| {model} | ")) && l.matches('|').count() == 8)
            .collect();
        assert!(!in_process.is_empty(), "{model}:\n{text}");
        for row in in_process {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert!(cells[3] != "-" && cells[4] != "-", "{row}");
        }
    }
    // The MLP's max_batch_size is probed at load: its probe's figures are in the table (at the
    // sizes the probe tried, which stop where throughput stops growing: not always at 64).
    assert!(
        text.lines().any(|l| l.starts_with("| mlp | ")
            && l.matches('|').count() == 8
            && !l.trim_end().ends_with("| - | - |")),
        "{text}"
    );
    assert!(text.contains("(3 of 3 exited 0)"), "{text}");
}
