"""Triton's system shared-memory extension with NVIDIA's tritonclient, unmodified: the client
puts inputs in POSIX shared memory and names them, the server reads them there and writes the
outputs into the region the client names, over HTTP and gRPC."""
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from test_tritonclient import assert_close, reference


@pytest.fixture
def regions():
    made = []

    def make(name, size):
        key = f"/sheaf_test_{os.getpid()}_{name}"
        handle = shm.create_shared_memory_region(name, key, size)
        made.append(handle)
        return key, handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_travel_in_shared_memory(server, protocol, regions):
    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(url=server.http if protocol == "http" else server.grpc)
    x = np.random.default_rng(5).standard_normal((4, 512)).astype(np.float32)
    in_key, in_handle = regions("in", x.nbytes)
    out_size = 4 * 10 * 4
    out_key, out_handle = regions("out", out_size)
    shm.set_shared_memory_region(in_handle, [x])
    client.unregister_system_shared_memory()
    client.register_system_shared_memory("in", in_key, x.nbytes)
    client.register_system_shared_memory("out", out_key, out_size)

    status = client.get_system_shared_memory_status()
    if protocol == "grpc":
        status = [{"name": r.name, "key": r.key, "byte_size": r.byte_size}
                  for r in status.regions.values()]
    assert sorted((r["name"], r["key"], int(r["byte_size"])) for r in status) == \
        sorted([("in", in_key, x.nbytes), ("out", out_key, out_size)])

    inp = lib.InferInput("input", list(x.shape), "FP32")
    inp.set_shared_memory("in", x.nbytes)
    out = lib.InferRequestedOutput("output")
    out.set_shared_memory("out", out_size)
    client.infer("mlp", [inp], outputs=[out])
    got = shm.get_contents_as_numpy(out_handle, np.float32, [4, 10])
    assert_close(got, reference(server, "mlp", {"input": x})[0])

    # An output region too small for the output, and a region nobody registered: errors that
    # say so.
    small = lib.InferRequestedOutput("output")
    small.set_shared_memory("out", 16)
    with pytest.raises(InferenceServerException) as e:
        client.infer("mlp", [inp], outputs=[small])
    assert "more than the 16 bytes" in str(e.value)
    missing = lib.InferInput("input", list(x.shape), "FP32")
    missing.set_shared_memory("nowhere", x.nbytes)
    with pytest.raises(InferenceServerException) as e:
        client.infer("mlp", [missing])
    assert "no shared-memory region 'nowhere'" in str(e.value)

    client.unregister_system_shared_memory("in")
    names = client.get_system_shared_memory_status()
    if protocol == "grpc":
        names = [{"name": n} for n in names.regions]
    assert [r["name"] for r in names] == ["out"]
    client.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_is_refused_naming_system_shared_memory(server, protocol):
    """tritonclient's CUDA shared-memory calls get answers: no region registered, and a register
    refused with what to use instead, not an unknown route or a bare UNIMPLEMENTED."""
    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(url=server.http if protocol == "http" else server.grpc)
    status = client.get_cuda_shared_memory_status()
    assert (list(status.regions) if protocol == "grpc" else status) == []
    with pytest.raises(InferenceServerException) as e:
        client.register_cuda_shared_memory("frames", b"\0" * 64, 0, 1024)
    assert "CUDA shared memory is not supported" in str(e.value)
    assert "system shared-memory region" in str(e.value)
    assert e.value.status() == ("StatusCode.UNIMPLEMENTED" if protocol == "grpc" else "501")
    with pytest.raises(InferenceServerException) as e:
        client.get_cuda_shared_memory_status("frames")
    assert "no CUDA shared-memory region 'frames'" in str(e.value)
    client.unregister_cuda_shared_memory("frames")
    client.unregister_cuda_shared_memory()
    # The server metadata does not claim the extension.
    metadata = client.get_server_metadata()
    extensions = metadata.extensions if protocol == "grpc" else metadata["extensions"]
    assert "cuda_shared_memory" not in extensions and "system_shared_memory" in extensions
