"""Triton's logging extension: the real `sheaf` binary's log settings read and changed while it
runs, over HTTP and gRPC with NVIDIA's tritonclient, and seen in the lines it writes."""
import json
import os
import subprocess
import time

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import binary, start

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
                           ({"log_file": "/nonexistent/folder/sheaf.log"}, "cannot open"),
                           ({"log_file": True}, "'log_file' takes a file's path"),
                           ({"log_format": "ISO8601"}, "--log-format")):
        with pytest.raises(InferenceServerException) as e:
            http.update_log_settings(settings)
        assert says in str(e.value), e.value
    # Nothing changed by the refused ones.
    assert http.get_log_settings()["log_info"] is True
    grpc = grpcclient.InferenceServerClient(server.grpc)
    with pytest.raises(InferenceServerException) as e:
        grpc.update_log_settings({"log_file": "/nonexistent/folder/sheaf.log"})
    assert "cannot open '/nonexistent/folder/sheaf.log'" in str(e.value), e.value
    assert grpc.get_log_settings(as_json=True)["settings"]["log_file"] == {"string_param": ""}


def file_levels(path, wanted):
    """The levels of the JSON lines in the file at `path`, once `wanted` is among them (for at
    most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        levels = [json.loads(line).get("level")
                  for line in (path.read_text().splitlines() if path.exists() else [])]
        if wanted in levels or time.monotonic() > deadline:
            return levels
        time.sleep(0.05)


def test_a_log_file_takes_the_lines_while_it_is_set(server, tmp_path):
    """`log_file` set over HTTP: the lines go to that file (appended to what it held), none to
    stderr; set to "" over gRPC: they come to stderr again and the file keeps what it had."""
    http = httpclient.InferenceServerClient(server.http)
    grpc = grpcclient.InferenceServerClient(server.grpc)
    path = tmp_path / "sheaf.log"
    path.write_text("")
    try:
        assert http.update_log_settings({"log_file": str(path)})["log_file"] == str(path)
        assert grpc.get_log_settings(as_json=True)["settings"]["log_file"] == {
            "string_param": str(path)}
        mark = settled(server)
        http.load_model("echo")
        assert "INFO" in file_levels(path, "INFO")
        assert settled(server) == mark, server.log[mark:]
    finally:
        grpc.update_log_settings({"log_file": ""})
    held = path.read_text()
    assert any(json.loads(line)["fields"].get("model") == "echo" for line in held.splitlines())
    mark = settled(server)
    http.unload_model("echo")
    http.load_model("echo")
    assert "INFO" in levels_after(server, mark, "INFO")
    assert path.read_text() == held
    assert http.get_log_settings()["log_file"] == ""


def test_log_file_at_start_takes_every_line(tmp_path):
    """`--log-file` (tritonserver's flag): from the first line on, the log is in the file and
    stderr stays empty; the setting names the file."""
    repo = tmp_path / "repo"
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "1" / "model.py").write_text(MODEL)
    (repo / "echo" / "config.pbtxt").write_text(CONFIG)
    path = tmp_path / "sheaf.log"
    proc = subprocess.Popen(
        [binary(), "serve", "--model-repository", str(repo), "--http-port", "0",
         "--grpc-port", "0", "--metrics-port", "0", "--log-format", "json",
         "--log-file", str(path)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, "SHEAF_DRAIN_DELAY": "0"})
    try:
        assert "INFO" in file_levels(path, "INFO")
        address, deadline = None, time.monotonic() + 60
        while address is None and time.monotonic() < deadline:
            for line in path.read_text().splitlines():
                fields = json.loads(line)["fields"]
                if "server ready" in fields.get("message", ""):
                    address = [json.loads(x)["fields"].get("address")
                               for x in path.read_text().splitlines()]
                    address = next(a for a in address if a)
            time.sleep(0.05)
        assert address, path.read_text()
        http = httpclient.InferenceServerClient(address)
        assert http.is_model_ready("echo")
        assert http.get_log_settings()["log_file"] == str(path)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert err == "", err
    assert any(json.loads(line)["fields"].get("message") == "shut down"
               for line in path.read_text().splitlines()), path.read_text()


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


def test_triton_s_log_format_words_name_the_text_format(tmp_path):
    """`--log-format ISO8601` (and `default`), as tritonserver takes it: sheaf's text lines,
    each stamped in ISO 8601; the logging extension takes `ISO8601` as naming that format."""
    import re
    repo = tmp_path / "repo"
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "1" / "model.py").write_text(MODEL)
    (repo / "echo" / "config.pbtxt").write_text(CONFIG)
    proc = subprocess.Popen(
        [binary(), "serve", "--model-repository", str(repo), "--http-port", "0",
         "--grpc-port", "0", "--metrics-port", "0", "--log-format", "ISO8601"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, "SHEAF_DRAIN_DELAY": "0"})
    try:
        lines, address = [], None
        for line in proc.stderr:
            lines.append(line)
            found = re.search(r"HTTP listening on http://(\S+)", line)
            address = found.group(1) if found else address
            if "server ready" in line:
                break
        assert address, "".join(lines)
        assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", line) for line in lines), lines
        http = httpclient.InferenceServerClient(address)
        assert http.get_log_settings()["log_format"] == "default"
        assert http.update_log_settings({"log_format": "ISO8601"})["log_format"] == "default"
        with pytest.raises(InferenceServerException):
            http.update_log_settings({"log_format": "json"})
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
