"""gRPC's health checking protocol (grpc.health.v1.Health) on the gRPC port, called as
Kubernetes' gRPC probes and grpc_health_probe call it, with grpcio: Check answers SERVING for the
server ("" or the inference service's name) and NOT_FOUND for other names; Watch sends the status,
then NOT_SERVING as soon as a SIGTERM announces the drain, and ends; keys are not needed.

The two messages are written and read by hand (field 1 of each): grpcio-health-checking needs a
protobuf that tritonclient does not take."""
import queue
import signal
import threading

import grpc
import pytest

from conftest import API_KEY, launch, link_models

SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3


def request(service):
    data = service.encode()
    assert len(data) < 128
    return b"\x0a" + bytes([len(data)]) + data if data else b""


def status(message):
    # An absent field is 0 (UNKNOWN); else field 1 as a one-byte varint.
    if not message:
        return 0
    assert message[0] == 0x08 and len(message) == 2, message
    return message[1]


def check(address, service="", metadata=None):
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/grpc.health.v1.Health/Check")
        return status(call(request(service), metadata=metadata, timeout=10))


def test_check_answers_for_the_server_and_refuses_other_names(server):
    assert check(server.grpc) == SERVING
    assert check(server.grpc, "inference.GRPCInferenceService") == SERVING
    with pytest.raises(grpc.RpcError) as refused:
        check(server.grpc, "mlp")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no service 'mlp' here" in refused.value.details()


def test_check_takes_no_key(protected):
    # The server takes keys for inference; probes need none, as over HTTP.
    assert check(protected.grpc) == SERVING
    assert check(protected.grpc, metadata=[("authorization", f"Bearer {API_KEY}")]) == SERVING


def test_watch_reports_the_drain_and_ends(tmp_path):
    link_models(tmp_path, ["mlp"])
    proc, server = launch(tmp_path, "--drain-delay", "2")
    try:
        seen = queue.Queue()

        def watch(service):
            with grpc.insecure_channel(server.grpc) as channel:
                call = channel.unary_stream("/grpc.health.v1.Health/Watch")
                try:
                    for message in call(request(service), timeout=60):
                        seen.put((service, status(message)))
                    seen.put((service, "ended"))
                except grpc.RpcError as e:
                    seen.put((service, e.code()))

        watchers = [threading.Thread(target=watch, args=(s,)) for s in ("", "nope")]
        for w in watchers:
            w.start()
        first = {seen.get(timeout=10), seen.get(timeout=10)}
        assert first == {("", SERVING), ("nope", SERVICE_UNKNOWN)}, first
        proc.send_signal(signal.SIGTERM)
        # NOT_SERVING at once (the drain delay keeps the port open 2 s more), then the end.
        rest = [seen.get(timeout=10) for _ in range(3)]
        assert ("", NOT_SERVING) in rest and ("", "ended") in rest, rest
        assert ("nope", "ended") in rest, rest
        assert rest.index(("", NOT_SERVING)) < rest.index(("", "ended")), rest
        for w in watchers:
            w.join(timeout=10)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()


def test_a_restricted_health_group_covers_the_health_service(tmp_path):
    link_models(tmp_path, ["mlp"])
    proc, server = launch(tmp_path, "--grpc-restricted-protocol", "health:probe-key=v")
    try:
        with pytest.raises(grpc.RpcError) as refused:
            check(server.grpc)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "triton-grpc-protocol-probe-key" in refused.value.details()
        assert check(server.grpc, metadata=[("triton-grpc-protocol-probe-key", "v")]) == SERVING
    finally:
        proc.kill()
