"""Generates the ONNX models that sheaf's demo, tests and benchmarks need beyond the fetched ones.

Usage: make_models.py KIND OUT.onnx, where KIND is:
  mlp       -- a 512->2048->2048->10 ReLU MLP with seeded weights, batch dimension dynamic
  mlp_small -- a 512->1024->10 ReLU MLP (the perf_analyzer benchmark's model)
  fixed     -- a model whose first dimension is fixed at 2 (no batch dimension): y = x * 2 + 1
  allint    -- a model that echoes one input of each integer/bool/float dtype, for dtype round trips
  varlen    -- variable length: x [batch, seq] -> y = 2x + 1 [batch, seq], z = sum over seq [batch]
  mean      -- an image-sized input that costs almost nothing to run: x [batch, 150528] (602 KB per
               item, a 224x224x3 float image) -> y = mean over x [batch], for transport benchmarks
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp(sizes=(512, 2048, 2048, 10)):
    rng = np.random.default_rng(7)
    nodes, inits = [], []
    prev = "input"
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        bias = (rng.standard_normal(b) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(bias, f"b{i}")]
        last = i == len(sizes) - 2
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"]))
        nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], ["output" if last else f"add{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"add{i}"], [f"h{i}"]))
            prev = f"h{i}"
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", sizes[-1]])],
        inits,
    )
    return graph


def fixed():
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])]
    return helper.make_graph(
        nodes, "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [two, one],
    )


ECHO_TYPES = {
    "INT8": TensorProto.INT8, "INT16": TensorProto.INT16, "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "BOOL": TensorProto.BOOL,
    "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
}


def allint():
    nodes, ins, outs = [], [], []
    for name, t in ECHO_TYPES.items():
        nodes.append(helper.make_node("Identity", [f"in_{name}"], [f"out_{name}"]))
        ins.append(helper.make_tensor_value_info(f"in_{name}", t, ["batch", 3]))
        outs.append(helper.make_tensor_value_info(f"out_{name}", t, ["batch", 3]))
    return helper.make_graph(nodes, "echo", ins, outs)


def varlen():
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["y"]),
        helper.make_node("ReduceSum", ["x", "axes"], ["z"], keepdims=0),
    ]
    return helper.make_graph(
        nodes, "varlen",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch"])],
        [two, one, axes],
    )


def mean():
    return helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)], "mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 150528])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
    )


def main():
    kind, out = sys.argv[1], sys.argv[2]
    kinds = {"mlp": mlp, "mlp_small": lambda: mlp((512, 1024, 10)), "fixed": fixed, "allint": allint,
             "varlen": varlen, "mean": mean}
    graph = kinds[kind]()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, out)


if __name__ == "__main__":
    main()
