"""Decodes each request's encoded images with Pillow and normalises them for EfficientNet-Lite0:
the shorter side resized to 256, the centre 224x224 cropped, values scaled to [-1, 1], channels
first. A request whose image does not decode fails alone, as the client's error (400 /
INVALID_ARGUMENT), with Pillow's reason."""
import io
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.resize = int(config["parameters"]["resize"]["string_value"])
        self.crop = int(config["parameters"]["crop"]["string_value"])

    def pixels(self, encoded):
        image = Image.open(io.BytesIO(encoded)).convert("RGB")
        w, h = image.size
        scale = self.resize / min(w, h)
        size = (max(self.resize, int(w * scale)), max(self.resize, int(h * scale)))
        # Each channel resized in floating point (bilinear, antialiased), rounded once at the
        # end: as sheaf's own image step does.
        channels = [np.asarray(c.convert("F").resize(size, Image.BILINEAR)) for c in image.split()]
        x = np.clip(np.rint(np.stack(channels, axis=-1)), 0, 255)
        w, h = size
        left, top = (w - self.crop) // 2, (h - self.crop) // 2
        x = x[top:top + self.crop, left:left + self.crop].astype(np.float32) / 255.0
        return ((x - 0.5) / 0.5).transpose(2, 0, 1)

    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy()
            try:
                pixels = np.stack([self.pixels(row[0]) for row in images])
            except Image.UnidentifiedImageError:
                responses.append(refused("not an image Pillow decodes"))
                continue
            except Exception as e:  # noqa: BLE001 - the client's image, the client's error
                responses.append(refused(e))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("pixels", pixels)]))
        return responses


def refused(why):
    """The response of a request whose image does not decode: the client's error."""
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(
        f"cannot decode the image: {why}", pb_utils.TritonError.INVALID_ARG))
