"""BF16 tensors in Python models, served by the real `sheaf` binary: Triton's API (through
DLPack, as Triton's BF16 models trade them with PyTorch, and in a request a model sends) and
sheaf's batched API (ml_dtypes' bfloat16 arrays), over HTTP (binary and JSON) and gRPC with
NVIDIA's tritonclient; and an interpreter without ml_dtypes, which fails such a model's load
saying so."""
import concurrent.futures
import json
import shutil

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, http, start

# Values bfloat16 holds exactly, and their doubles too. tritonclient sends and reads BF16 as
# ml_dtypes' bfloat16 arrays.
VALUES = np.array([[1.5, -2.25, 3.0, 0.0078125], [-0.5, 96.0, 1.0, -7.0]],
                  dtype=ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("bf16-repo")
    for name in ("halves", "halves_batched", "halves_relay"):
        shutil.copytree(ROOT / "tests/python_models" / name, repo / name)
    # The batched model again, run by an interpreter that cannot import ml_dtypes.
    blocked = tmp_path_factory.mktemp("no-ml-dtypes")
    (blocked / "ml_dtypes.py").write_text('raise ImportError("no ml_dtypes here")\n')
    python = blocked / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{blocked}" exec "{ROOT / ".venv/bin/python"}" "$@"\n')
    python.chmod(0o755)
    (repo / "without" / "1").mkdir(parents=True)
    (repo / "without" / "1" / "model.py").write_text("def infer(inputs):\n    return inputs\n")
    config = (ROOT / "tests/python_models/halves_batched/config.yaml").read_text()
    (repo / "without" / "config.yaml").write_text(config + f'python: "{python}"\n')
    yield from start(repo)


def infer(module, url, model, values, names):
    client = module.InferenceServerClient(url)
    given = module.InferInput(names[0], list(values.shape), "BF16")
    given.set_data_from_numpy(values)
    result = client.infer(model, [given])
    return [result.as_numpy(n) for n in names[1:]]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_triton_s_api_trades_bf16_through_dlpack(server, module):
    url = server.http if module is httpclient else server.grpc
    doubled, wide, kind = infer(module, url, "halves", VALUES, ["X", "DOUBLED", "WIDE",
                                                               "DLPACK_TYPE"])
    assert doubled.dtype == ml_dtypes.bfloat16 and wide.dtype == np.float32
    np.testing.assert_array_equal(doubled, VALUES * 2)
    np.testing.assert_array_equal(wide, VALUES.astype(np.float32))
    # The capsule `to_dlpack()` made declared bfloat16: DLPack's code 4, 16 bits, 1 lane.
    assert kind.tolist() == [[4, 16, 1]] * 2


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_the_batched_api_takes_and_gives_bfloat16_arrays(server, module):
    url = server.http if module is httpclient else server.grpc
    (y,) = infer(module, url, "halves_batched", VALUES, ["x", "y"])
    np.testing.assert_array_equal(y, VALUES * 2)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_bf16_goes_through_a_request_a_model_sends(server, module):
    url = server.http if module is httpclient else server.grpc
    (y,) = infer(module, url, "halves_relay", VALUES, ["X", "Y"])
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y, VALUES * 2)


def test_concurrent_bf16_requests_are_batched_and_each_gets_its_own_answer(server):
    rows = [np.full((1, 4), v, dtype=ml_dtypes.bfloat16)
            for v in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(
            lambda x: infer(httpclient, server.http, "halves", x, ["X", "DOUBLED"])[0], rows * 4))
    for x, got in zip(rows * 4, answers):
        np.testing.assert_array_equal(got, x * 2)
    stats = httpclient.InferenceServerClient(server.http).get_inference_statistics("halves")
    model = stats["model_stats"][0]
    assert model["execution_count"] < model["inference_count"], model


def test_bf16_over_json_is_numbers_both_ways(server):
    status, _, body = http(f"http://{server.http}/v2/models/halves_batched/infer", json.dumps({
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "BF16",
                    "data": VALUES[0].astype(float).tolist()}]}).encode())
    assert status == 200, body
    (output,) = json.loads(body)["outputs"]
    assert output["datatype"] == "BF16" and output["shape"] == [1, 4]
    assert output["data"] == (VALUES[0] * 2).astype(float).tolist()


def test_an_interpreter_without_ml_dtypes_fails_the_load_saying_so(server):
    client = httpclient.InferenceServerClient(server.http)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["without"]["state"] == "UNAVAILABLE"
    assert "'x' is BF16" in index["without"]["reason"], index["without"]
    assert "install ml_dtypes" in index["without"]["reason"], index["without"]
    assert client.is_model_ready("halves_batched")
