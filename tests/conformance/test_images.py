"""Images at the edge with NVIDIA's tritonclient, unmodified: photographs sent as BYTES
tensors (encoded PNG) to EfficientNet-Lite0, and the classification extension naming the
classes, over HTTP and gRPC."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT

PHOTOS = {"cat.png": "282:tiger cat", "coffee.png": "967:espresso"}


def photo(name):
    path = ROOT / ".cache/test-images" / name
    assert path.is_file(), f"{path} is missing: run scripts/setup.sh --test"
    return path.read_bytes()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_photographs_come_back_as_their_classes(server, protocol):
    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(url=server.http if protocol == "http" else server.grpc)
    images = np.array([photo(n) for n in PHOTOS], dtype=np.object_)
    inp = lib.InferInput("input", [len(images)], "BYTES")
    if protocol == "http":
        inp.set_data_from_numpy(images, binary_data=True)
        out = lib.InferRequestedOutput("logits", binary_data=False, class_count=3)
    else:
        inp.set_data_from_numpy(images)
        out = lib.InferRequestedOutput("logits", class_count=3)
    result = client.infer("efficientnet", [inp], outputs=[out])
    classes = result.as_numpy("logits")
    assert classes.shape == (2, 3)
    for row, want in zip(classes, PHOTOS.values()):
        best = row[0].decode() if isinstance(row[0], bytes) else row[0]
        assert best.split(":", 1)[1] == want, row
        scores = [float((c.decode() if isinstance(c, bytes) else c).split(":")[0]) for c in row]
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_corrupt_image_is_refused_by_index(server, protocol):
    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(url=server.http if protocol == "http" else server.grpc)
    images = np.array([photo("cat.png"), photo("coffee.png")[:500]], dtype=np.object_)
    inp = lib.InferInput("input", [2], "BYTES")
    inp.set_data_from_numpy(images)
    with pytest.raises(InferenceServerException) as e:
        client.infer("efficientnet", [inp])
    assert "image 1" in str(e.value)
