//! A model process's shared memory leaves no file behind once the process has mapped it, so
//! that nothing stays in /dev/shm however the server or the process ends. (One test in its own
//! process: the files are named after the process.)

use std::path::Path;

use bytes::Bytes;
use sheaf_backend::{Backend, DataType, LoadSpec, Tensor};
use sheaf_python::PythonBackend;

fn ours() -> Vec<String> {
    let prefix = format!("sheaf-{}-", std::process::id());
    let dir = if Path::new("/dev/shm").is_dir() {
        Path::new("/dev/shm").to_path_buf()
    } else {
        std::env::temp_dir()
    };
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

#[test]
fn shared_memory_has_no_name_once_the_process_holds_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    assert!(python.is_file(), "run scripts/setup.sh first");
    let dir = std::env::temp_dir().join(format!("sheaf-shm-test-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("echo")).unwrap();
    std::fs::write(
        dir.join("echo/model.py"),
        "def infer(inputs):\n    return {'y': inputs['x']}\n",
    )
    .unwrap();
    let config = serde_json::json!({
        "max_batch_size": 4,
        "input": [{"name": "x", "data_type": "TYPE_UINT8", "dims": [3]}],
        "output": [{"name": "y", "data_type": "TYPE_UINT8", "dims": [3]}],
    });
    let spec = LoadSpec {
        path: dir.join("echo/model.py"),
        intra_op_threads: 1,
        device: Default::default(),
        session_per_batch_size: false,
        io_binding: Some(false),
        cuda: Default::default(),
        graph: Default::default(),
        model_config: Some(config.to_string()),
        interpreter: Some(python),
        auto_complete: true,
        max_batch_size_open: false,
        execution_timeout: None,
    };
    let mut model = PythonBackend::default().load(&spec).unwrap();
    assert_eq!(ours(), Vec::<String>::new());
    let x = Tensor::new(
        DataType::U8,
        vec![2, 3],
        Bytes::from_static(&[1, 2, 3, 4, 5, 6]),
    )
    .unwrap();
    assert_eq!(model.infer(std::slice::from_ref(&x)).unwrap()[0], x);
    assert_eq!(ours(), Vec::<String>::new());
    drop(model);
    let _ = std::fs::remove_dir_all(dir);
}
