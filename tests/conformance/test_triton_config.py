"""A model folder written for Triton (`config.pbtxt`, a version folder, files beside them) served
by the real `sheaf` binary: the fields sheaf reads take effect, seen through NVIDIA's
tritonclient."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, start

NAMES = [f"class-{i}" for i in range(10)]
CONFIG = '''
name: "scorer"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "names.txt" } ]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("triton-repo")
    (repo / "scorer" / "1").mkdir(parents=True)
    (repo / "scorer" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
    (repo / "scorer" / "config.pbtxt").write_text(CONFIG)
    (repo / "scorer" / "names.txt").write_text("\n".join(NAMES) + "\n")
    yield from start(repo)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_output_s_label_filename_names_its_classes(server, module):
    client = module.InferenceServerClient(server.http if module is httpclient else server.grpc)
    x = np.random.default_rng(5).random((2, 512), dtype=np.float32)
    inputs = [module.InferInput("input", [2, 512], "FP32")]
    inputs[0].set_data_from_numpy(x)
    logits = client.infer("scorer", inputs).as_numpy("output")
    out = module.InferRequestedOutput("output", class_count=2)
    classes = client.infer("scorer", inputs, outputs=[out]).as_numpy("output")
    for row, scores in zip(classes, logits):
        best = np.argsort(-scores)[:2]
        got = [c.decode().split(":") for c in row]
        assert [int(index) for _, index, _ in got] == list(best)
        assert [name for _, _, name in got] == [NAMES[i] for i in best]
