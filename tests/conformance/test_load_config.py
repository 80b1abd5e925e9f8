"""A load request that carries a configuration (Triton's `config` load parameter, as
tritonclient's `load_model(name, config=...)` sends it): the real `sheaf` binary, a Triton Python
model whose factor and batch size come from its configuration, over HTTP and gRPC."""
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import start

MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.factor = float(config["parameters"]["factor"]["string_value"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * self.factor)])
            for r in requests]
'''
CONFIG = '''
backend: "python"
max_batch_size: 8
dynamic_batching { }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "factor" value: { string_value: "2" } }
'''
ENSEMBLE = '''
platform: "ensemble"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "scaled" model_version: -1
  input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] }
'''


def given(factor, max_batch_size):
    """The configuration in Triton's JSON form, as a client writes it."""
    return json.dumps({
        "backend": "python",
        "max_batch_size": max_batch_size,
        "dynamic_batching": {},
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
        "parameters": {"factor": {"string_value": str(factor)}},
    })


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("loadconfig")
    (repo / "scaled" / "1").mkdir(parents=True)
    (repo / "scaled" / "1" / "model.py").write_text(MODEL)
    (repo / "scaled" / "config.pbtxt").write_text(CONFIG)
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(ENSEMBLE)
    (repo / "steady").mkdir()
    (repo / "steady" / "model.sim.yaml").write_text(
        "input: {name: x, shape: [-1, 64]}\noutput: {name: y}\nlatency_ms: {points: [[1, 0.1], [64, 0.1]]}\n")
    yield from start(repo, "--model-control-mode", "explicit", "--load-model", "scaled",
                     "--load-model", "steady")


ADMIN = "sk-load-admin"


def admin(grpc=False):
    return {("authorization" if grpc else "Authorization"): f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """The same models on a server with an admin key, which takes loads that send files."""
    repo = tmp_path_factory.mktemp("loadfiles")
    (repo / "scaled" / "1").mkdir(parents=True)
    (repo / "scaled" / "1" / "model.py").write_text(MODEL)
    (repo / "scaled" / "config.pbtxt").write_text(CONFIG)
    yield from start(repo, "--model-control-mode", "explicit", "--load-model", "scaled",
                     "--admin-key", ADMIN)


def ask(module, url):
    x = module.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    return float(module.InferenceServerClient(url).infer("scaled", [x]).as_numpy("y")[0, 0])


def test_a_load_with_a_config_serves_with_it_until_loaded_again(server):
    http = httpclient.InferenceServerClient(server.http)
    assert ask(httpclient, server.http) == 2.0
    assert http.get_model_config("scaled")["max_batch_size"] == 8

    http.load_model("scaled", config=given(5, 4))
    assert ask(httpclient, server.http) == 5.0
    assert http.get_model_config("scaled")["max_batch_size"] == 4

    grpc = grpcclient.InferenceServerClient(server.grpc)
    grpc.load_model("scaled", config=given(7, 2))
    assert ask(grpcclient, server.grpc) == 7.0
    assert grpc.get_model_config("scaled").config.max_batch_size == 2

    # Loaded again without one: the folder's configuration again.
    http.load_model("scaled")
    assert ask(httpclient, server.http) == 2.0
    assert http.get_model_config("scaled")["max_batch_size"] == 8


def test_a_config_that_cannot_be_read_is_refused_and_the_model_serves_on(server):
    http = httpclient.InferenceServerClient(server.http)
    for config, says in (("{", "is not JSON"),
                         ('{"max_batch_size": "many"}', "load parameter 'config': "),
                         ("[1]", "not a JSON object")):
        with pytest.raises(InferenceServerException) as e:
            http.load_model("scaled", config=config)
        assert says in str(e.value), e.value
    grpc = grpcclient.InferenceServerClient(server.grpc)
    with pytest.raises(InferenceServerException) as e:
        grpc.load_model("scaled", config="{")
    assert "is not JSON" in str(e.value), e.value
    assert ask(httpclient, server.http) == 2.0


def test_counts_no_host_could_serve_are_refused_and_the_model_serves_on(server):
    """A count that would exhaust the server's threads or memory before the load could fail
    is refused with its limit; a batch the host's memory cannot hold is refused before its
    warm-up allocates it. The server stays up and the model serves as before."""
    http = httpclient.InferenceServerClient(server.http)
    for change, says in (
        ({"instance_group": [{"count": 1000000}]}, "instances is 1000000; at most 1024"),
        ({"dynamic_batching": {"priority_levels": 4000000000}},
         "priority_levels is 4000000000; at most 65536"),
    ):
        config = json.loads(given(3, 8))
        config.update(change)
        with pytest.raises(InferenceServerException) as e:
            http.load_model("scaled", config=json.dumps(config))
        assert says in str(e.value), e.value
    assert ask(httpclient, server.http) == 2.0

    with pytest.raises(InferenceServerException) as e:
        http.load_model("steady", config=json.dumps({"max_batch_size": 10 ** 11}))
    assert "a batch of 100000000000 items" in str(e.value), e.value
    assert "lower max_batch_size" in str(e.value), e.value
    assert http.is_server_live()
    x = httpclient.InferInput("x", [2, 64], "FP32")
    x.set_data_from_numpy(np.ones((2, 64), np.float32))
    assert http.infer("steady", [x]).as_numpy("y").shape == (2, 64)


def test_a_pipeline_with_a_config_is_refused(server):
    http = httpclient.InferenceServerClient(server.http)
    with pytest.raises(InferenceServerException) as e:
        http.load_model("chain", config=ENSEMBLE_JSON)
    assert "is a pipeline" in str(e.value), e.value
    http.load_model("chain")
    x = httpclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    assert float(http.infer("chain", [x]).as_numpy("y")[0, 0]) == 2.0


def test_a_load_with_files_serves_them_until_loaded_again(keyed):
    """tritonclient's load_model(name, config=..., files={"file:1/model.py": bytes}): the model
    loads from the files sent (HTTP: base64, gRPC: bytes), whether or not the repository holds
    it; a load without files reads its folder again."""
    http = httpclient.InferenceServerClient(keyed.http)
    tripled = VERSIONED_MODEL.format(factor=3).encode()
    http.load_model("scaled", config=given(2, 8), files={"file:1/model.py": tripled},
                    headers=admin())
    assert ask(httpclient, keyed.http) == 3.0
    # A model the repository does not hold, over gRPC, with a file beside its version folder.
    grpc = grpcclient.InferenceServerClient(keyed.grpc)
    reader = (VERSIONED_MODEL.replace("import numpy as np", "import numpy as np\nimport os")
              .replace("* {factor}", "* float(open(os.path.join(os.path.dirname(__file__), "
                       "'..', 'factor.txt')).read())"))
    grpc.load_model("uploaded", config=given(1, 4), headers=admin(grpc=True),
                    files={"file:1/model.py": reader.encode(), "file:factor.txt": b"11"})
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    assert float(grpc.infer("uploaded", [x]).as_numpy("y")[0, 0]) == 11.0
    assert grpc.get_model_config("uploaded").config.max_batch_size == 4
    index = {m["name"]: m["state"] for m in http.get_model_repository_index(headers=admin())}
    assert index["uploaded"] == "READY", index
    # Loaded again without files: the repository's folder.
    http.load_model("scaled", headers=admin())
    assert ask(httpclient, keyed.http) == 2.0
    http.unload_model("uploaded", headers=admin())


def test_a_load_with_files_that_cannot_serve_is_refused_and_the_model_serves_on(keyed):
    http = httpclient.InferenceServerClient(keyed.http)
    model = {"file:1/model.py": MODEL.encode()}
    for config, files, says in (
            (None, model, "needs the 'config' parameter"),
            (given(3, 8), {"file:../escape.py": b"x"}, "give a path inside the model's folder"),
            (given(3, 8), {"file:1/notes.txt": b"x"}, "hold no model file sheaf runs"),
            (given(3, 8), {"file:1/model.py": b"import no_such_module"}, "no_such_module")):
        with pytest.raises(InferenceServerException) as e:
            http.load_model("scaled", config=config, files=files, headers=admin())
        assert says in str(e.value), e.value
        assert ask(httpclient, keyed.http) == 2.0
    grpc = grpcclient.InferenceServerClient(keyed.grpc)
    with pytest.raises(InferenceServerException) as e:
        grpc.load_model("scaled", files=model, headers=admin(grpc=True))
    assert "StatusCode.INVALID_ARGUMENT" in str(e.value), e.value


def test_a_load_with_files_needs_a_server_with_an_admin_key(server):
    """The files may be code the server would run: a server without an admin key refuses
    them (403 / PERMISSION_DENIED), whoever asks."""
    model = {"file:1/model.py": MODEL.encode()}
    http = httpclient.InferenceServerClient(server.http)
    with pytest.raises(InferenceServerException) as e:
        http.load_model("scaled", config=given(3, 8), files=model)
    assert "start it with --admin-key" in str(e.value), e.value
    grpc = grpcclient.InferenceServerClient(server.grpc)
    with pytest.raises(InferenceServerException) as e:
        grpc.load_model("scaled", config=given(3, 8), files=model)
    assert "StatusCode.PERMISSION_DENIED" in str(e.value), e.value
    assert ask(httpclient, server.http) == 2.0


ENSEMBLE_JSON = json.dumps({"platform": "ensemble", "max_batch_size": 8})


VERSIONED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * {factor})])
            for r in requests]
"""


def test_a_load_s_config_picks_the_versions_by_its_own_version_policy(tmp_path):
    """Versions 1-3 of a model that multiplies by its version; the folder's configuration serves
    the newest. A load's configuration replaces the folder's version policy with its own, and one
    without a policy serves the newest alone again, as Triton's does."""
    for v in (1, 2, 3):
        (tmp_path / "v" / str(v)).mkdir(parents=True)
        (tmp_path / "v" / str(v) / "model.py").write_text(VERSIONED_MODEL.format(factor=v))
    (tmp_path / "v" / "config.pbtxt").write_text(CONFIG)
    base = {"backend": "python", "max_batch_size": 8,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}
    for s in start(tmp_path, "--model-control-mode", "explicit", "--load-model", "v"):
        http = httpclient.InferenceServerClient(s.http)

        def versions():
            return http.get_model_metadata("v")["versions"]

        def ask(version=""):
            x = httpclient.InferInput("x", [1, 1], "FP32")
            x.set_data_from_numpy(np.ones((1, 1), np.float32))
            return float(http.infer("v", [x], model_version=version).as_numpy("y")[0, 0])

        assert versions() == ["3"] and ask() == 3.0
        http.load_model("v", config=json.dumps(
            {**base, "version_policy": {"specific": {"versions": [1]}}}))
        assert versions() == ["1"] and ask() == 1.0
        http.load_model("v", config=json.dumps(
            {**base, "version_policy": {"latest": {"num_versions": 2}}}))
        assert versions() == ["2", "3"] and ask("2") == 2.0 and ask() == 3.0
        http.load_model("v", config=json.dumps(base))
        assert versions() == ["3"]
        with pytest.raises(InferenceServerException) as e:
            http.load_model("v", config=json.dumps(
                {**base, "version_policy": {"specific": {"versions": [9]}}}))
        assert "names no version the folder holds" in str(e.value), e.value
        assert versions() == ["3"] and ask() == 3.0

