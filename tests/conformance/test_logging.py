"""Triton's logging extension: the real `sheaf` binary's log settings read and changed while it
runs, over HTTP and gRPC with NVIDIA's tritonclient, and seen in the lines it writes."""
import json
import time

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import start

MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]
'''
CONFIG = '''
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("logging")
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "1" / "model.py").write_text(MODEL)
    (repo / "echo" / "config.pbtxt").write_text(CONFIG)
    yield from start(repo, "--model-control-mode", "explicit")


def settled(server):
    """The number of lines the server has written once none has come for 0.3 s: lines reach
    `server.log` through a pipe and a reader thread, so one written before a change of settings
    can be appended after it."""
    count, still = len(server.log), time.monotonic()
    while time.monotonic() - still < 0.3:
        time.sleep(0.05)
        if len(server.log) != count:
            count, still = len(server.log), time.monotonic()
    return count


def levels_after(server, mark, wanted=None):
    """The levels of the lines the server wrote since `mark` lines: once `wanted` is among them
    (for at most 10 s), or, with none wanted, after a pause in which lines would have come."""
    deadline = time.monotonic() + (10 if wanted else 0.5)
    while True:
        levels = []
        for line in server.log[mark:]:
            try:
                levels.append(json.loads(line).get("level"))
            except ValueError:
                pass
        if (wanted and wanted in levels) or time.monotonic() > deadline:
            return levels
        time.sleep(0.05)


def test_the_settings_are_triton_s_and_the_extension_is_listed(server):
    http = httpclient.InferenceServerClient(server.http)
    assert "logging" in http.get_server_metadata()["extensions"]
    assert http.get_log_settings() == {
        "log_file": "", "log_info": True, "log_warnings": True, "log_errors": True,
        "log_verbose_level": 0, "log_format": "json",
    }
    grpc = grpcclient.InferenceServerClient(server.grpc)
    settings = grpc.get_log_settings(as_json=True)["settings"]
    assert settings["log_info"] == {"bool_param": True}, settings
    assert settings["log_format"] == {"string_param": "json"}, settings


def test_changed_settings_change_the_lines_written(server):
    http = httpclient.InferenceServerClient(server.http)
    # Verbose: the server's debug lines (an instance ready) are written.
    mark = len(server.log)
    assert http.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    http.load_model("echo")
    assert "DEBUG" in levels_after(server, mark, "DEBUG")
    # Info off, verbose off: a load writes no info line ("model loaded") nor debug line.
    http.update_log_settings({"log_verbose_level": 0, "log_info": False})
    try:
        mark = settled(server)
        http.unload_model("echo")
        http.load_model("echo")
        written = levels_after(server, mark)
        assert "INFO" not in written and "DEBUG" not in written, server.log[mark:]
    finally:
        # Over gRPC, info on again (also when the assertion above failed, so that the next
        # test starts from the defaults).
        grpc = grpcclient.InferenceServerClient(server.grpc)
        grpc.update_log_settings({"log_info": True})
    # The next load writes its info lines.
    mark = settled(server)
    http.unload_model("echo")
    http.load_model("echo")
    assert "INFO" in levels_after(server, mark, "INFO")
    assert http.get_log_settings()["log_info"] is True


def test_a_setting_that_cannot_be_applied_is_refused_by_name(server):
    http = httpclient.InferenceServerClient(server.http)
    for settings, says in (({"log_level": 1}, "unknown log setting 'log_level'"),
                           ({"log_info": 1}, "'log_info' takes true or false"),
                           ({"log_file": "/tmp/sheaf.log"}, "stderr"),
                           ({"log_format": "ISO8601"}, "--log-format")):
        with pytest.raises(InferenceServerException) as e:
            http.update_log_settings(settings)
        assert says in str(e.value), e.value
    # Nothing changed by the refused ones.
    assert http.get_log_settings()["log_info"] is True
    grpc = grpcclient.InferenceServerClient(server.grpc)
    with pytest.raises(InferenceServerException) as e:
        grpc.update_log_settings({"log_file": "/tmp/sheaf.log"})
    assert "stderr" in str(e.value), e.value


def test_triton_s_start_up_log_flags_set_the_settings(tmp_path):
    """`--log-verbose`, `--log-warning` (and `--log-info`, `--log-error`) as tritonserver takes
    them: the settings start from them, and the lines follow."""
    repo = tmp_path / "repo"
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "1" / "model.py").write_text(MODEL)
    (repo / "echo" / "config.pbtxt").write_text(CONFIG)
    for server in start(repo, "--log-verbose", "1", "--log-warning=false"):
        http = httpclient.InferenceServerClient(server.http)
        settings = http.get_log_settings()
        assert settings["log_verbose_level"] == 1 and settings["log_warnings"] is False
        assert settings["log_info"] is True and settings["log_errors"] is True
        # Debug lines were written at start (an instance ready).
        assert "DEBUG" in levels_after(server, 0, "DEBUG")
