//! The Python backend driven through the `Model` trait, as an instance thread drives it, with a
//! real interpreter (the project's .venv, made by scripts/setup.sh) and real NumPy: answers,
//! per-request errors, a process that exits or hangs and is started again (or ends while idle,
//! and is started again at once), the model's own `is_ready()`, and `finalize` on drop.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sheaf_backend::{
    Answer, Backend, BackendError, DataType, LoadSpec, RequestInfo, ResponseStream, Tensor,
};
use sheaf_python::PythonBackend;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn interpreter() -> PathBuf {
    let python = root().join(".venv/bin/python");
    assert!(python.is_file(), "run scripts/setup.sh first");
    python
}

/// A model folder `dir/<name>/` holding `model.py`.
fn model(dir: &Path, name: &str, code: &str) -> PathBuf {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("model.py"), code).unwrap();
    folder.join("model.py")
}

fn spec(path: PathBuf, config: serde_json::Value, timeout_ms: Option<u64>) -> LoadSpec {
    LoadSpec {
        path,
        intra_op_threads: 1,
        device: Default::default(),
        session_per_batch_size: false,
        io_binding: Some(false),
        cuda: Default::default(),
        graph: Default::default(),
        model_config: Some(config.to_string()),
        interpreter: Some(interpreter()),
        auto_complete: true,
        max_batch_size_open: false,
        execution_timeout: timeout_ms.map(Duration::from_millis),
    }
}

fn floats(rows: &[[f32; 2]]) -> Tensor {
    let data: Vec<u8> = rows
        .iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    Tensor::new(DataType::F32, vec![rows.len(), 2], Bytes::from(data)).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn tensors() -> serde_json::Value {
    serde_json::json!({
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}],
    })
}

const TRITON: &str = r#"
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "finalized")
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            if x[0, 0] == 2:
                os._exit(7)
            if x[0, 0] == 3:
                time.sleep(30)
            if x[0, 0] < 0:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative")))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x + 1)]))
        return out
    def finalize(self):
        open(self.marker, "w").write(str(os.getpid()))
"#;

#[test]
fn a_batched_model_answers_the_whole_batch() {
    let dir = tempdir("batched");
    let path = model(
        &dir,
        "double",
        "def infer(inputs):\n    return {'y': inputs['x'] * 2}\n",
    );
    let mut m = PythonBackend::default()
        .load(&spec(path, tensors(), None))
        .unwrap();
    assert!(!m.answers_requests());
    assert_eq!(m.declared_max_batch_size(), Some(8));
    assert_eq!(m.signature().inputs[0].shape, [-1, 2]);
    let out = m.infer(&[floats(&[[1.0, 2.0], [3.0, 4.0]])]).unwrap();
    assert_eq!(values(&out[0]), [2.0, 4.0, 6.0, 8.0]);
    assert!(
        m.memory_bytes().unwrap() > 1 << 20,
        "the process's resident memory"
    );
}

#[test]
fn a_triton_model_answers_each_request_and_survives_exits_and_hangs() {
    let dir = tempdir("triton");
    let path = model(&dir, "plus", TRITON);
    let mut m = PythonBackend::default()
        .load(&spec(path, tensors(), Some(1500)))
        .unwrap();
    assert!(m.answers_requests());
    let first = RequestInfo {
        id: "first".into(),
        ..RequestInfo::default()
    };
    let answers = m.infer_requests(
        &[vec![floats(&[[1.0, 1.0]])], vec![floats(&[[-1.0, 0.0]])]],
        &[&first, &RequestInfo::NONE],
    );
    assert_eq!(values(&answers[0].as_ref().unwrap().outputs[0]), [2.0, 2.0]);
    assert!(answers[1]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("negative"));
    for (what, says) in [
        (2.0, "exit status: 7"),
        (3.0, "execution timeout (1500 ms)"),
    ] {
        let lost = m.infer_requests(
            &[vec![floats(&[[what, 0.0]])], vec![floats(&[[1.0, 0.0]])]],
            &[],
        );
        for answer in &lost {
            let e = answer.as_ref().unwrap_err().to_string();
            assert!(e.contains("Python process") && e.contains(says), "{e}");
        }
        // Started again: the next call is answered.
        let back = m.infer_requests(&[vec![floats(&[[5.0, 5.0]])]], &[]);
        assert_eq!(values(&back[0].as_ref().unwrap().outputs[0]), [6.0, 6.0]);
    }
    drop(m);
    let pid = std::fs::read_to_string(dir.join("plus/finalized")).expect("finalize ran");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the process ended"
    );
}

#[test]
fn a_decoupled_model_streams_each_response_as_it_is_sent() {
    let dir = tempdir("decoupled");
    let path = model(
        &dir,
        "twice",
        r#"
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            sender = r.get_response_sender()
            for k in (1, 2):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * k)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"#,
    );
    let mut config = tensors();
    config["model_transaction_policy"] = serde_json::json!({"decoupled": true});
    let mut m = PythonBackend::default()
        .load(&spec(path, config, Some(5000)))
        .unwrap();
    assert!(m.streams());
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let streams = (0..2)
        .map(|i| {
            Box::new(Collect {
                index: i,
                seen: seen.clone(),
            }) as Box<dyn ResponseStream>
        })
        .collect();
    m.infer_streaming(
        &[vec![floats(&[[1.0, 2.0]])], vec![floats(&[[3.0, 4.0]])]],
        &[],
        streams,
    )
    .unwrap();
    // What the model sent before `execute` returned has reached the streams when the call
    // returns, each request's final flag included.
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (0, Some(vec![1.0, 2.0])),
            (0, Some(vec![2.0, 4.0])),
            (0, None),
            (1, Some(vec![3.0, 4.0])),
            (1, Some(vec![6.0, 8.0])),
            (1, None),
        ]
    );
}

/// What the streams got: the request's index, and a response's values or `None` at its end.
type Seen = Arc<Mutex<Vec<(usize, Option<Vec<f32>>)>>>;

/// A request's stream that writes down what it gets.
struct Collect {
    index: usize,
    seen: Seen,
}

impl ResponseStream for Collect {
    fn part(&mut self, response: Result<Answer, BackendError>) {
        let values = values(&response.unwrap().outputs[0]);
        self.seen.lock().unwrap().push((self.index, Some(values)));
    }

    fn end(self: Box<Self>, result: Result<(), BackendError>) {
        result.unwrap();
        self.seen.lock().unwrap().push((self.index, None));
    }

    fn is_cancelled(&self) -> bool {
        false
    }
}

#[test]
fn a_model_that_does_not_import_is_a_load_error_with_pythons_message() {
    let dir = tempdir("broken");
    let path = model(&dir, "broken", "import no_such_module_here\n");
    let e = PythonBackend::default()
        .load(&spec(path, tensors(), None))
        .err()
        .expect("a load error")
        .to_string();
    assert!(
        e.contains("ModuleNotFoundError") && e.contains("no_such_module_here"),
        "{e}"
    );
}

/// A Triton model whose `is_ready()` answers as the file `state` beside it says, and whose
/// `execute` answers each request with its process id after sleeping `x` ms; its import takes a
/// second once the file `slow` exists.
const READY: &str = r#"
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(HERE, "slow")):
    time.sleep(1)

class TritonPythonModel:
    def is_ready(self):
        try:
            state = open(os.path.join(HERE, "state")).read().strip()
        except FileNotFoundError:
            return True
        if state == "raise":
            raise RuntimeError("the feature store is down")
        if state == "number":
            return 1
        return state == "yes"

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            time.sleep(float(x[0, 0]) / 1000)
            pid = np.full_like(x, os.getpid())
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", pid)]))
        return out
"#;

#[test]
fn the_models_is_ready_is_asked_while_a_batch_runs() {
    let dir = tempdir("ready");
    let path = model(&dir, "gate", READY);
    let state = dir.join("gate/state");
    let mut m = PythonBackend::default()
        .load(&spec(path, tensors(), None))
        .unwrap();
    let check = m
        .ready_check()
        .expect("a Python model says whether it is ready");
    assert_eq!(check.check(), Ok(()));
    for (written, says) in [
        ("no", "its is_ready() returned False"),
        ("raise", "RuntimeError: the feature store is down"),
        ("number", "is_ready() must return a bool, not int"),
    ] {
        std::fs::write(&state, written).unwrap();
        let e = check.check().unwrap_err();
        assert!(e.contains(says), "{written}: {e}");
    }
    std::fs::write(&state, "yes").unwrap();
    // A batch of three seconds runs; the question is answered meanwhile.
    let batch = std::thread::spawn(move || {
        let answers = m.infer_requests(&[vec![floats(&[[3000.0, 0.0]])]], &[]);
        (m, answers)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(check.check(), Ok(()));
    assert!(
        !batch.is_finished(),
        "answered while the batch ran, not after it"
    );
    let (_m, answers) = batch.join().unwrap();
    assert!(answers[0].is_ok());
}

#[test]
fn a_process_that_ends_while_idle_is_started_again_before_any_batch() {
    let dir = tempdir("idle");
    let path = model(&dir, "gate", READY);
    let mut m = PythonBackend::default()
        .load(&spec(path, tensors(), None))
        .unwrap();
    let check = m.ready_check().unwrap();
    let pid_of = |answers: Vec<Result<Answer, BackendError>>| {
        values(&answers[0].as_ref().unwrap().outputs[0])[0] as u32
    };
    let first = pid_of(m.infer_requests(&[vec![floats(&[[0.0, 0.0]])]], &[]));
    // Its next process takes a second to import.
    std::fs::write(dir.join("gate/slow"), "").unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-9", &first.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // Not ready while the next process starts, with the reason; ready once it has.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let mut down = None;
    loop {
        match check.check() {
            Err(e) => down = Some(e),
            Ok(()) if down.is_some() => break,
            Ok(()) => {}
        }
        assert!(std::time::Instant::now() < until, "not started again");
        std::thread::sleep(Duration::from_millis(20));
    }
    let down = down.unwrap();
    assert!(
        down.contains("was lost") && down.contains("being started again"),
        "{down}"
    );
    // The process started before any batch asked for one: the next batch finds it.
    let second = pid_of(m.infer_requests(&[vec![floats(&[[0.0, 0.0]])]], &[]));
    assert_ne!(second, first);
    assert_eq!(check.check(), Ok(()));
}

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sheaf-python-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
