"""Web pages of other sites calling the server from a browser (CORS, `--cors-allow-origin`): the
requests a browser sends for a page's `fetch` (its preflight, then the request with the page's
`Origin` and `Sec-Fetch-Site`), sent as the browser sends them, against the real server."""
import json
import subprocess

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import binary, http, link_models, start

APP = "https://app.example.com"
LOCAL = "http://localhost:3000"
KEY = "sk-cors"


def infer_body(binary_output=False):
    output = {"name": "output", "parameters": {"binary_data": binary_output}}
    return json.dumps({
        "inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                    "data": [0.25] * 512}],
        "outputs": [output],
    }).encode()


def from_page(origin, *extra):
    """The headers a browser adds to a page's cross-site fetch."""
    return [("Origin", origin), ("Sec-Fetch-Site", "cross-site"), ("Sec-Fetch-Mode", "cors"),
            *extra]


def preflight(server, path, origin, method="POST", headers="authorization,content-type"):
    return http(f"http://{server.http}{path}", method="OPTIONS", headers=[
        ("Origin", origin), ("Access-Control-Request-Method", method),
        ("Access-Control-Request-Headers", headers), ("Sec-Fetch-Mode", "cors")])


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cors")
    link_models(repo, ["mlp"])
    return repo


@pytest.fixture(scope="module")
def plain(repo):
    yield from start(repo)


@pytest.fixture(scope="module")
def allowed(repo):
    yield from start(repo, "--cors-allow-origin", f"{APP}, {LOCAL}/", "--api-key", KEY)


@pytest.fixture(scope="module")
def anyone(repo):
    yield from start(repo, "--cors-allow-origin", "*")


def reference(server, headers=()):
    client = httpclient.InferenceServerClient(server.http)
    x = httpclient.InferInput("input", [1, 512], "FP32")
    x.set_data_from_numpy(np.full((1, 512), 0.25, np.float32))
    return client.infer("mlp", [x], headers=dict(headers)).as_numpy("output")


def test_without_allowed_origins_a_page_of_another_site_can_do_nothing(plain):
    status, headers, _ = preflight(plain, "/v2/models/mlp/infer", APP)
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    status, headers, body = http(f"http://{plain.http}/v2/models/mlp/infer", infer_body(),
                                 headers=from_page(APP))
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    assert "--cors-allow-origin" in json.loads(body)["error"]
    status, headers, _ = http(f"http://{plain.http}/v2/health/ready", headers=from_page(APP))
    assert status == 200 and "Access-Control-Allow-Origin" not in headers


def test_a_page_of_an_allowed_origin_calls_the_server_with_its_key(allowed):
    for origin in (APP, LOCAL):
        # The preflight needs no key: a browser sends none with it.
        status, headers, _ = preflight(allowed, "/v2/models/mlp/infer", origin)
        assert status == 200
        assert headers["Access-Control-Allow-Origin"] == origin
        assert "POST" in headers["Access-Control-Allow-Methods"]
        assert headers["Access-Control-Allow-Headers"] == "authorization,content-type"
        assert headers["Access-Control-Max-Age"] == "3600"
        assert "origin" in headers["Vary"].lower()
        status, headers, body = http(
            f"http://{allowed.http}/v2/models/mlp/infer", infer_body(),
            headers=from_page(origin, ("Authorization", f"Bearer {KEY}")))
        assert status == 200, body
        assert headers["Access-Control-Allow-Origin"] == origin
        exposed = headers["Access-Control-Expose-Headers"].lower()
        assert "inference-header-content-length" in exposed and "retry-after" in exposed
        output = json.loads(body)["outputs"][0]
        expected = reference(allowed, [("Authorization", f"Bearer {KEY}")])
        np.testing.assert_allclose(np.array(output["data"]).reshape(output["shape"]), expected,
                                   rtol=1e-6)
    # Without its key the page is refused, and can read why.
    status, headers, body = http(f"http://{allowed.http}/v2/models/mlp/infer", infer_body(),
                                 headers=from_page(APP))
    assert status == 401 and headers["Access-Control-Allow-Origin"] == APP
    assert "API key" in json.loads(body)["error"]


def test_a_page_reads_a_binary_answer_s_json_length(allowed):
    status, headers, body = http(
        f"http://{allowed.http}/v2/models/mlp/infer", infer_body(binary_output=True),
        headers=from_page(APP, ("Authorization", f"Bearer {KEY}")))
    assert status == 200 and headers["Access-Control-Allow-Origin"] == APP
    length = int(headers["Inference-Header-Content-Length"])
    head = json.loads(body[:length])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == len(body) - length == 40


def test_pages_of_other_origins_stay_refused(allowed):
    for origin in ("https://evil.example.com", "http://localhost:3001", "null"):
        status, headers, _ = preflight(allowed, "/v2/models/mlp/infer", origin)
        assert "Access-Control-Allow-Origin" not in headers, origin
        status, headers, body = http(
            f"http://{allowed.http}/v2/models/mlp/infer", infer_body(),
            headers=from_page(origin, ("Authorization", f"Bearer {KEY}")))
        assert status == 403 and "Access-Control-Allow-Origin" not in headers, origin
        assert "other sites" in json.loads(body)["error"]
    # Programs that send no Origin are served as before.
    assert reference(allowed, [("Authorization", f"Bearer {KEY}")]).shape == (1, 10)


def test_every_route_of_the_http_port_takes_part(allowed):
    status, headers, body = http(f"http://{allowed.http}/v1/models",
                                 headers=from_page(LOCAL, ("Authorization", f"Bearer {KEY}")))
    assert status == 200 and headers["Access-Control-Allow-Origin"] == LOCAL
    assert json.loads(body)["object"] == "list"
    status, headers, body = http(f"http://{allowed.http}/v2/models/mlp",
                                 headers=from_page(LOCAL, ("Authorization", f"Bearer {KEY}")))
    assert status == 200 and headers["Access-Control-Allow-Origin"] == LOCAL
    assert json.loads(body)["name"] == "mlp"
    status, headers, _ = preflight(allowed, "/v1/responses/resp_1", LOCAL, method="DELETE")
    assert status == 200 and "DELETE" in headers["Access-Control-Allow-Methods"]


def test_a_star_lets_every_origin_in(anyone):
    for origin in (APP, "null"):
        status, headers, _ = preflight(anyone, "/v2/models/mlp/infer", origin)
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
        status, headers, body = http(f"http://{anyone.http}/v2/models/mlp/infer", infer_body(),
                                     headers=from_page(origin))
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "*", body


@pytest.mark.parametrize("value, why", [
    ("app.example.com", "no scheme"),
    ("https://app.example.com/page", "more than a host"),
    ("*,https://app.example.com", "cannot be listed with others"),
])
def test_a_value_that_is_not_an_origin_stops_the_start(repo, value, why):
    done = subprocess.run(
        [binary(), "serve", "--model-repository", str(repo),
         "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
         "--cors-allow-origin", value],
        capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert why in done.stderr and "--cors-allow-origin" in done.stderr, done.stderr
