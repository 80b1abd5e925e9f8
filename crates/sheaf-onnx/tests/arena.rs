//! One arena per device: a model with a session per batch size, its sessions allocating from
//! the device's shared arena, holds about what its largest batch size needs alone, not the sum
//! over its sizes, and less than sessions with arenas of their own; what the `auto` probe and
//! the first runs grew goes back after the warm-up, and the whole arena when the last model on
//! the device is dropped. Measured on the CPU as the process's
//! resident memory, each case in a process of its own (this test binary run again for one
//! case), on the real EfficientNet-Lite0.

use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use sheaf_backend::{DataType, Model, Tensor};
use sheaf_onnx::{OnnxModel, OnnxOptions};

/// The case a child process measures, and where it prints its figure.
const CASE: &str = "SHEAF_ARENA_CASE";
const LARGEST: usize = 32;
const SIZES: [usize; 4] = [1, 4, 16, LARGEST];

fn model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../model_repository/efficientnet/1/model.onnx")
}

fn resident_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096.0 / (1024.0 * 1024.0)
}

fn batch(items: usize) -> Tensor {
    let n = items * 224 * 224 * 3;
    let data: Vec<u8> = (0..n)
        .flat_map(|i| ((i % 251) as f32 / 251.0).to_le_bytes())
        .collect();
    Tensor::new(DataType::F32, vec![items, 3, 224, 224], Bytes::from(data)).unwrap()
}

/// Not a test of its own: the body of one case, when this binary is run for it.
#[test]
fn measure_one_case() {
    let Ok(case) = std::env::var(CASE) else {
        return;
    };
    let lib = sheaf_onnx::library::locate(None).expect("ONNX Runtime: run scripts/setup.sh");
    sheaf_onnx::init(&lib).expect("ONNX Runtime loads");
    // The inputs first, so that only what the model holds is measured.
    let inputs: Vec<Tensor> = SIZES.iter().map(|&b| batch(b)).collect();
    if case == "counted" {
        // Two instances of the model, one after the other, each warmed as the server warms
        // its buckets: each one's count, and the process's growth while it loaded.
        let options = OnnxOptions {
            session_per_batch_size: true,
            ..OnnxOptions::default()
        };
        let mut loaded = Vec::new();
        for which in ["first", "second"] {
            let before = resident_mib();
            let mut model = OnnxModel::load(&model(), &options).unwrap();
            for input in inputs.iter().rev() {
                model.infer(std::slice::from_ref(input)).unwrap();
            }
            assert!(model
                .release_memory(std::slice::from_ref(&inputs[0]))
                .unwrap());
            for input in inputs.iter().rev() {
                model.infer(std::slice::from_ref(input)).unwrap();
            }
            let counted = model.memory_bytes().expect("a count after the warm-up") as f64;
            println!("counted-{which} {:.1}", counted / (1024.0 * 1024.0));
            println!("grown-{which} {:.1}", resident_mib() - before);
            loaded.push(model);
        }
        return;
    }
    let before = resident_mib();
    let (sizes, options) = match case.as_str() {
        "largest" => (&SIZES[3..], OnnxOptions::default()),
        "shared" => (
            &SIZES[..],
            OnnxOptions {
                session_per_batch_size: true,
                ..OnnxOptions::default()
            },
        ),
        "probed" | "probed-kept" | "unloaded" => (
            &SIZES[..],
            OnnxOptions {
                session_per_batch_size: true,
                ..OnnxOptions::default()
            },
        ),
        "own" => (
            &SIZES[..],
            OnnxOptions {
                session_per_batch_size: true,
                shared_arena: false,
                ..OnnxOptions::default()
            },
        ),
        other => panic!("unknown case {other}"),
    };
    let mut model = OnnxModel::load(&model(), &options).unwrap();
    if case.starts_with("probed") {
        // As the `auto` probe runs: smallest first, each size twice.
        for input in &inputs {
            for _ in 0..2 {
                model.infer(std::slice::from_ref(input)).unwrap();
            }
        }
    }
    // Largest first, as the server warms its buckets.
    for (input, &b) in inputs.iter().zip(&SIZES).rev() {
        if sizes.contains(&b) {
            for _ in 0..2 {
                model.infer(std::slice::from_ref(input)).unwrap();
            }
        }
    }
    // Then, as the server goes on: what no run holds goes back, and a second pass.
    if case == "probed" {
        assert!(model
            .release_memory(std::slice::from_ref(&inputs[0]))
            .unwrap());
        for input in inputs.iter().rev() {
            model.infer(std::slice::from_ref(input)).unwrap();
        }
    }
    if case == "unloaded" {
        // The model's sessions go, then its hold on the arena: the last one releases it.
        let loaded = resident_mib() - before;
        drop(model);
        println!("loaded-mib {loaded:.1}");
    }
    println!("resident-mib {:.1}", resident_mib() - before);
}

/// Runs this binary for `case` and returns the memory it measured.
fn measure(case: &str) -> f64 {
    parse(&run(case), "resident-mib ")
}

/// Runs this binary for `case` and returns what it printed.
fn run(case: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "measure_one_case",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CASE, case)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{case}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The figure `text` printed after `label`.
fn parse(text: &str, label: &str) -> f64 {
    text.lines()
        .find_map(|l| l.split(label).nth(1))
        .unwrap_or_else(|| panic!("no {label}in {text}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn buckets_share_one_arena_and_hold_about_their_largest_alone() {
    let largest = measure("largest");
    let shared = measure("shared");
    let own = measure("own");
    let figures = format!(
        "largest alone {largest:.1} MiB; four buckets: shared arena {shared:.1}, own arenas {own:.1}"
    );
    eprintln!("{figures}");
    // Measured here: 521, 596 and 672 MiB. What is left above the largest alone is mostly each
    // session's own copy of the weights (18 MB a session).
    assert!(shared < own, "{figures}");
    assert!(shared <= 1.25 * largest, "{figures}");
}

#[test]
fn the_memory_a_probe_and_first_runs_grew_goes_back_after_the_warm_up() {
    let largest = measure("largest");
    let kept = measure("probed-kept");
    let released = measure("probed");
    let figures = format!(
        "largest alone {largest:.1} MiB; probed upwards then warmed largest first: \
         {kept:.1} as the runs left it, {released:.1} released and warmed again"
    );
    eprintln!("{figures}");
    // Measured here: 504, 760 and 349 MiB (a size's first run allocates tensor by tensor,
    // and the planned runs after it take one block each; the largest alone holds both).
    assert!(released < kept, "{figures}");
    assert!(released <= largest, "{figures}");
}

#[test]
fn the_last_model_on_a_device_gives_its_arena_back_when_dropped() {
    let text = run("unloaded");
    let (loaded, after) = (parse(&text, "loaded-mib "), parse(&text, "resident-mib "));
    let figures =
        format!("four buckets loaded: {loaded:.1} MiB; after the model was dropped: {after:.1}");
    eprintln!("{figures}");
    assert!(after < 0.5 * loaded, "{figures}");
}

#[test]
fn a_model_counts_the_same_arena_memory_whichever_model_loaded_before_it() {
    let text = run("counted");
    let first = parse(&text, "counted-first ");
    let second = parse(&text, "counted-second ");
    let grown = (parse(&text, "grown-first "), parse(&text, "grown-second "));
    let file = std::fs::metadata(model()).unwrap().len() as f64 / (1024.0 * 1024.0);
    let figures = format!(
        "counted {first:.1} and {second:.1} MiB; the process grew {:.1} and {:.1} MiB while \
         each loaded; the file {file:.1} MiB",
        grown.0, grown.1
    );
    eprintln!("{figures}");
    // Measured here: 240.7 and 240.7 MiB counted, where the process grew 385.7 and 92.6 MiB:
    // the second's release gave back the room the first kept for its runs, which the second's
    // runs then took again.
    assert!(first >= file, "{figures}");
    assert!((second - first).abs() <= 0.1 * first, "{figures}");
}
