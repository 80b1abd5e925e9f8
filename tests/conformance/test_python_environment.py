"""A Python model's own environment (Triton's EXECUTION_ENV_PATH), served by the real `sheaf`
binary: a virtual environment in the model's folder, and the same packed as .tar.gz (as
conda-pack packs one), each run by its own interpreter with its `bin` first on PATH."""
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, start

# Says which interpreter runs it, and what comes first on its PATH.
WHERE = '''
import os
import sys

import numpy as np


def infer(inputs):
    n = len(inputs["x"])
    first = os.environ["PATH"].split(os.pathsep)[0]
    return {"prefix": np.array([[sys.prefix.encode()]] * n, dtype=np.object_),
            "path": np.array([[first.encode()]] * n, dtype=np.object_)}
'''
CONFIG = """inputs: [{name: x, data_type: FP32, dims: [1]}]
outputs: [{name: prefix, data_type: BYTES, dims: [1]}, {name: path, data_type: BYTES, dims: [1]}]
parameters: {EXECUTION_ENV_PATH: "%s"}
"""


def make_environment(at):
    """A virtual environment at `at` that finds the project's NumPy through a .pth file."""
    subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "venv", "--without-pip", str(at)],
                   check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = subprocess.run([str(ROOT / ".venv/bin/python"), "-c",
                           "import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (at / "lib" / version / "site-packages" / "project.pth").write_text(site + "\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("environment-repo")
    for name, value in (("in_folder", "$$TRITON_MODEL_DIRECTORY/env"),
                        ("packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz"),
                        ("missing", "$$TRITON_MODEL_DIRECTORY/gone.tar.gz")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(WHERE)
        (repo / name / "config.yaml").write_text(CONFIG % value)
    make_environment(repo / "in_folder" / "env")
    staging = tmp_path_factory.mktemp("staging")
    make_environment(staging / "env")
    with tarfile.open(repo / "packed" / "env.tar.gz", "w:gz") as tar:
        tar.add(staging / "env", arcname=".")
    yield from start(repo)


def ask(server, model):
    client = httpclient.InferenceServerClient(server.http)
    inputs = [httpclient.InferInput("x", [2, 1], "FP32")]
    inputs[0].set_data_from_numpy(np.zeros((2, 1), np.float32))
    result = client.infer(model, inputs)
    return result.as_numpy("prefix")[0, 0].decode(), result.as_numpy("path")[0, 0].decode()


def test_a_model_runs_on_the_environment_in_its_folder(server):
    prefix, path = ask(server, "in_folder")
    assert prefix == str(server.repo / "in_folder" / "env")
    assert path == os.path.join(prefix, "bin")


def test_a_packed_environment_is_unpacked_and_run(server):
    prefix, path = ask(server, "packed")
    assert os.path.dirname(prefix) == tempfile.gettempdir()
    assert os.path.basename(prefix).startswith("sheaf-env-")
    assert os.path.isfile(os.path.join(prefix, "pyvenv.cfg"))
    assert path == os.path.join(prefix, "bin")


def test_an_environment_that_is_not_there_is_a_clear_load_error(server):
    client = httpclient.InferenceServerClient(server.http)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["missing"]["state"] == "UNAVAILABLE"
    assert "EXECUTION_ENV_PATH '$$TRITON_MODEL_DIRECTORY/gone.tar.gz'" in index["missing"]["reason"]
    assert "is neither a folder nor a file" in index["missing"]["reason"]
