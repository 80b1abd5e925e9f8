"""Loading a model that is loaded loads it again from its folder, as Triton does, while the one
before keeps serving: the real `sheaf` binary, a Python model whose code changes between loads,
clients that never stop asking."""
import threading

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import SCALED_CODE, ask_scaled, start, write_scaled


@pytest.fixture
def server(tmp_path):
    write_scaled(tmp_path / "scaled", 2)
    for s in start(tmp_path, "--model-control-mode", "explicit", "--load-model", "scaled"):
        yield s, tmp_path


def ask(client):
    return ask_scaled(client, "scaled")


def test_a_loaded_model_loads_again_from_its_folder_without_a_gap(server):
    server, repo = server
    client = httpclient.InferenceServerClient(server.http)
    assert ask(client) == 2.0
    seen, errors, stop = [], [], threading.Event()

    def keep_asking():
        own = httpclient.InferenceServerClient(server.http)
        while not stop.is_set():
            try:
                seen.append(ask(own))
            except InferenceServerException as e:
                errors.append(e)

    askers = [threading.Thread(target=keep_asking) for _ in range(4)]
    for t in askers:
        t.start()
    (repo / "scaled" / "1" / "model.py").write_text(SCALED_CODE.format(factor=3))
    try:
        client.load_model("scaled")
        after = ask(client)
    finally:
        stop.set()
        for t in askers:
            t.join()
    assert after == 3.0, "the new code serves once the load returns"
    assert errors == [], errors[:3]
    assert set(seen) <= {2.0, 3.0} and 2.0 in seen, set(seen)


def test_a_load_again_that_fails_leaves_the_model_serving(server):
    server, repo = server
    client = httpclient.InferenceServerClient(server.http)
    (repo / "scaled" / "1" / "model.py").write_text("def infer(inputs:\n")
    with pytest.raises(InferenceServerException) as e:
        client.load_model("scaled")
    assert "did not load again, and serves as before" in str(e.value), e.value
    assert "SyntaxError" in str(e.value), e.value
    assert client.is_model_ready("scaled")
    assert ask(client) == 2.0
