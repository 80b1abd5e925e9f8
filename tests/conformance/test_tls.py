"""TLS and mutual TLS on every port, with certificates made by the test, checked with curl
--cacert, tritonclient's SSL options (HTTP and gRPC) and the openai client."""
import json
import ssl
import subprocess

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                               "data": [0.25] * 512}]})


def curl(*args):
    out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", *args], capture_output=True,
                         text=True)
    if out.returncode != 0:
        return out.returncode, out.stderr
    body, code = out.stdout.rsplit("\n", 1)
    return int(code), body


def port(address):
    return address.rsplit(":", 1)[1]


def mlp_inputs(module):
    tensor = module.InferInput("input", [1, 512], "FP32")
    tensor.set_data_from_numpy(np.full((1, 512), 0.25, dtype=np.float32))
    return [tensor]


def test_curl_over_tls_with_the_ca(tls, certificates):
    url = f"https://localhost:{port(tls.http)}/v2/models/mlp/infer"
    code, reply = curl("--cacert", certificates["ca.pem"], url,
                       "-H", "content-type: application/json", "-d", BODY)
    assert code == 200, reply
    assert json.loads(reply)["outputs"][0]["shape"] == [1, 10]
    # Without the CA the certificate is not trusted; plain HTTP is not spoken.
    code, _ = curl(url, "-d", BODY)
    assert code == 60  # curl: peer certificate cannot be authenticated
    code, _ = curl(f"http://localhost:{port(tls.http)}/v2/health/ready")
    assert code != 200
    code, text = curl("--cacert", certificates["ca.pem"],
                      f"https://localhost:{port(tls.metrics)}/metrics")
    assert code == 200 and "sheaf_" in text


def test_tritonclient_over_tls(tls, certificates):
    http = httpclient.InferenceServerClient(
        f"localhost:{port(tls.http)}", ssl=True, ssl_options={"ca_certs": certificates["ca.pem"]})
    assert http.is_server_ready()
    assert http.infer("mlp", mlp_inputs(httpclient)).as_numpy("output").shape == (1, 10)
    grpc = grpcclient.InferenceServerClient(
        f"localhost:{port(tls.grpc)}", ssl=True, root_certificates=certificates["ca.pem"])
    assert grpc.is_server_ready()
    assert grpc.infer("mlp", mlp_inputs(grpcclient)).as_numpy("output").shape == (1, 10)


def test_openai_over_tls(tls, certificates):
    context = ssl.create_default_context(cafile=certificates["ca.pem"])
    client = openai.OpenAI(base_url=f"https://localhost:{port(tls.http)}/v1", api_key="unused",
                           http_client=openai.DefaultHttpxClient(verify=context))
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.choices[0].message.content


def grpc_takes_only_clients_with_a_certificate(address, certificates):
    """A gRPC client with the test CA's client certificate is served at `address` over mutual
    TLS; one without is refused."""
    grpc = grpcclient.InferenceServerClient(
        f"localhost:{port(address)}", ssl=True, root_certificates=certificates["ca.pem"],
        private_key=certificates["client.key"], certificate_chain=certificates["client.pem"])
    assert grpc.infer("mlp", mlp_inputs(grpcclient)).as_numpy("output").shape == (1, 10)
    anonymous = grpcclient.InferenceServerClient(
        f"localhost:{port(address)}", ssl=True, root_certificates=certificates["ca.pem"])
    with pytest.raises(InferenceServerException):
        anonymous.infer("mlp", mlp_inputs(grpcclient), client_timeout=10)


def test_mutual_tls_takes_only_clients_with_a_certificate(mtls, certificates):
    url = f"https://localhost:{port(mtls.http)}/v2/health/ready"
    code, _ = curl("--cacert", certificates["ca.pem"], url)
    assert code != 200, "a client without a certificate was served"
    code, reply = curl("--cacert", certificates["ca.pem"], "--cert", certificates["client.pem"],
                       "--key", certificates["client.key"], url)
    assert code == 200, reply
    http = httpclient.InferenceServerClient(
        f"localhost:{port(mtls.http)}", ssl=True,
        ssl_options={"ca_certs": certificates["ca.pem"], "certfile": certificates["client.pem"],
                     "keyfile": certificates["client.key"]})
    assert http.infer("mlp", mlp_inputs(httpclient)).as_numpy("output").shape == (1, 10)
    grpc_takes_only_clients_with_a_certificate(mtls.grpc, certificates)


def test_triton_s_grpc_ssl_flags_put_the_grpc_port_alone_behind_tls(tmp_path, certificates):
    """tritonserver's --grpc-use-ssl with --grpc-server-cert/-key: gRPC over TLS, HTTP plain (as
    Kubernetes probes often want it); --grpc-use-ssl-mutual with --grpc-root-cert: gRPC clients
    must present a certificate; the flags without --grpc-use-ssl, or TLS without its files,
    stop the start saying why."""
    from conftest import launch, link_models, start
    repo = tmp_path / "repo"
    repo.mkdir()
    link_models(repo, ["mlp"])
    ssl_flags = ["--grpc-use-ssl", "true", "--grpc-server-cert", certificates["server.pem"],
                 "--grpc-server-key", certificates["server.key"]]
    for server in start(repo, *ssl_flags):
        code, _ = curl(f"http://localhost:{port(server.http)}/v2/health/ready")
        assert code == 200, "HTTP stays plain"
        grpc = grpcclient.InferenceServerClient(
            f"localhost:{port(server.grpc)}", ssl=True, root_certificates=certificates["ca.pem"])
        assert grpc.infer("mlp", mlp_inputs(grpcclient)).as_numpy("output").shape == (1, 10)
        plain = grpcclient.InferenceServerClient(f"localhost:{port(server.grpc)}")
        with pytest.raises(InferenceServerException):
            plain.infer("mlp", mlp_inputs(grpcclient), client_timeout=10)
    for server in start(repo, "--grpc-use-ssl-mutual", "true", *ssl_flags[2:],
                        "--grpc-root-cert", certificates["ca.pem"]):
        grpc_takes_only_clients_with_a_certificate(server.grpc, certificates)
    for flags, says in ((ssl_flags[2:], "are read with --grpc-use-ssl true"),
                        (ssl_flags[:2], "needs --grpc-server-cert and --grpc-server-key"),
                        (["--grpc-use-ssl-mutual", "true", *ssl_flags[2:]],
                         "needs --grpc-root-cert")):
        with pytest.raises(RuntimeError) as stopped:
            proc, _ = launch(repo, *flags)
            proc.kill()
        assert says in str(stopped.value), stopped.value
