"""Triton's `poll` model control mode: the real `sheaf` binary looks at its repository every
--repository-poll-secs, and a model folder added loads, one changed loads again while the one
before keeps serving, and one removed unloads and leaves the index; the load and unload API is
refused, as under Triton."""
import os
import shutil
import threading
import time

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import SCALED_CODE, ask_scaled, launch, start, write_scaled

def eventually(check, what, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except InferenceServerException:
            pass
        assert time.monotonic() < deadline, f"not seen within {timeout} s: {what}"
        time.sleep(0.1)


def test_the_repository_s_changes_load_and_unload_models(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    write_scaled(repo / "scaled", 2)
    for server in start(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.5"):
        client = httpclient.InferenceServerClient(server.http)
        assert ask_scaled(client, "scaled") == 2.0
        # No load or unload API in this mode, as under Triton.
        for call in (lambda: client.load_model("scaled"), lambda: client.unload_model("scaled")):
            with pytest.raises(InferenceServerException) as refused:
                call()
            assert "'poll'" in str(refused.value), refused.value

        # A folder added (written beside the repository, then moved in whole) loads.
        staged = tmp_path / "tripled"
        write_scaled(staged, 3)
        shutil.move(str(staged), str(repo / "tripled"))
        eventually(lambda: client.is_model_ready("tripled"), "the added model ready")
        assert ask_scaled(client, "tripled") == 3.0

        # A changed model loads again while the one before serves: no request fails.
        answers, errors, stop = [], [], threading.Event()

        def keep_asking():
            own = httpclient.InferenceServerClient(server.http)
            while not stop.is_set():
                try:
                    answers.append(ask_scaled(own, "scaled"))
                except InferenceServerException as e:
                    errors.append(e)

        asker = threading.Thread(target=keep_asking)
        asker.start()
        try:
            # Written whole (a poll never sees half a file).
            (tmp_path / "model.py").write_text(SCALED_CODE.format(factor=5))
            os.replace(tmp_path / "model.py", repo / "scaled" / "1" / "model.py")
            eventually(lambda: answers and answers[-1] == 5.0, "the changed model's answers")
        finally:
            stop.set()
            asker.join()
        assert not errors, errors[:3]
        assert set(answers) <= {2.0, 5.0} and answers[0] == 2.0

        # A folder removed unloads, and leaves the index.
        shutil.rmtree(repo / "tripled")
        eventually(lambda: "tripled" not in [m["name"] for m in
                                             client.get_model_repository_index()],
                   "the removed model gone from the index")
        assert not client.is_model_ready("tripled")
        with pytest.raises(InferenceServerException):
            ask_scaled(client, "tripled")
        assert ask_scaled(client, "scaled") == 5.0
        # Nothing changes: nothing loads again (one load of each model in all).
        time.sleep(1.5)
        stats = client.get_inference_statistics("scaled")["model_stats"][0]
        assert stats.get("load_count", 0) == 2, stats


def test_poll_needs_a_repository_and_a_positive_interval(tmp_path):
    for repo, extra, says in (
            (tmp_path, ["--repository-poll-secs", "0"], "--repository-poll-secs must be"),
            (None, [], "give --model-repository")):
        with pytest.raises(RuntimeError) as stopped:
            proc, _ = launch(repo, "--model-control-mode", "poll", *extra)
            proc.kill()
        assert says in str(stopped.value), stopped.value
