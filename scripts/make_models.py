"""Generates the ONNX models that sheaf's demo, tests and benchmarks need beyond the fetched ones.

Usage: make_models.py KIND OUT.onnx, where KIND is:
  mlp       -- a 512->2048->2048->10 ReLU MLP with seeded weights, batch dimension dynamic
  mlp_small -- a 512->1024->10 ReLU MLP (the perf_analyzer benchmark's model)
  fixed     -- a model whose first dimension is fixed at 2 (no batch dimension): y = x * 2 + 1
  allint    -- a model that echoes one input of each integer/bool/float dtype, for dtype round trips
  varlen    -- variable length: x [batch, seq] -> y = 2x + 1 [batch, seq], z = sum over seq [batch]
  gru       -- a stateful stream model: a GRU cell (80 features in, 1024 hidden, 20 out, seeded
               weights) whose hidden state is an input and an output, reset by START and left
               alone by a row whose READY is 0 (for sheaf's sequence batcher)
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


def gru(features=80, hidden=1024, out=20):
    """One GRU step per row: frame [b, 80], START [b, 1], READY [b, 1], state_in [b, 1024] ->
    output [b, 20] = h @ Wo + bo, state_out [b, 1024] = h, where h_prev = state_in * (1 - START),
    h = (1 - z) * n + z * h_prev (the GRU cell), and h = state_in where READY is 0."""
    rng = np.random.default_rng(11)
    inits = []

    def weight(name, shape, scale):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    inits.append(one)
    n = []

    def node(op, ins, out):
        n.append(helper.make_node(op, ins, [out]))
        return out

    keep = node("Sub", ["one", "START"], "keep")
    h_prev = node("Mul", ["state_in", keep], "h_prev")
    gates = {}
    for g in ("z", "r"):
        wx = node("MatMul", ["frame", weight(f"W{g}", (features, hidden), 1 / np.sqrt(features))], f"x{g}")
        uh = node("MatMul", [h_prev, weight(f"U{g}", (hidden, hidden), 1 / np.sqrt(hidden))], f"u{g}")
        pre = node("Add", [node("Add", [wx, uh], f"s{g}"), weight(f"b{g}", (hidden,), 0.1)], f"p{g}")
        gates[g] = node("Sigmoid", [pre], g)
    wx = node("MatMul", ["frame", weight("Wn", (features, hidden), 1 / np.sqrt(features))], "xn")
    rh = node("Mul", [gates["r"], h_prev], "rh")
    uh = node("MatMul", [rh, weight("Un", (hidden, hidden), 1 / np.sqrt(hidden))], "un")
    cand = node("Tanh", [node("Add", [node("Add", [wx, uh], "sn"), weight("bn", (hidden,), 0.1)], "pn")], "cand")
    one_minus_z = node("Sub", ["one", gates["z"]], "omz")
    h = node("Add", [node("Mul", [one_minus_z, cand], "a1"), node("Mul", [gates["z"], h_prev], "a2")], "h")
    # READY 0: the row's state passes through unchanged.
    idle = node("Sub", ["one", "READY"], "idle")
    node("Add", [node("Mul", ["READY", h], "hr"), node("Mul", [idle, "state_in"], "hi")], "state_out")
    y = node("MatMul", ["state_out", weight("Wo", (hidden, out), 1 / np.sqrt(hidden))], "y")
    node("Add", [y, weight("bo", (out,), 0.1)], "output")
    f = TensorProto.FLOAT
    return helper.make_graph(
        n, "gru",
        [helper.make_tensor_value_info("frame", f, ["batch", features]),
         helper.make_tensor_value_info("START", f, ["batch", 1]),
         helper.make_tensor_value_info("READY", f, ["batch", 1]),
         helper.make_tensor_value_info("state_in", f, ["batch", hidden])],
        [helper.make_tensor_value_info("output", f, ["batch", out]),
         helper.make_tensor_value_info("state_out", f, ["batch", hidden])],
        inits,
    )


def main():
    kind, out = sys.argv[1], sys.argv[2]
    kinds = {"mlp": mlp, "mlp_small": lambda: mlp((512, 1024, 10)), "fixed": fixed, "allint": allint,
             "varlen": varlen, "mean": mean, "gru": gru}
    graph = kinds[kind]()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, out)


if __name__ == "__main__":
    main()
