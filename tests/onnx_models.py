"""Small ONNX models built with ``onnx.helper`` (random weights, nothing downloaded), for the ONNX tests."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mainspring.models.repository import ModelRepository

TRITON_DATA = Path(__file__).parent / "data" / "triton_repo"
SUPPORTED = ("onnx_mlp", "onnx_fixed", "torch_mlp")


def write_mlp_onnx(
    file: Path, features: int = 16, hidden: int = 32, classes: int = 4, seed: int = 0, batch: int | str = "batch"
) -> None:
    """``y = relu(x @ w1 + b1) @ w2 + b2`` with input ``x`` [batch, features] FP32 and output ``y``
    [batch, classes] (``batch`` a number fixes it); a Reshape with a constant shape initializer shows
    that small constants stay in the graph."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = {
        "w1": rng.standard_normal((features, hidden)).astype(np.float32),
        "b1": rng.standard_normal(hidden).astype(np.float32),
        "w2": rng.standard_normal((hidden, classes)).astype(np.float32),
        "b2": rng.standard_normal(classes).astype(np.float32),
        "flat": np.array([-1, classes], dtype=np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["y0"]),
        helper.make_node("Add", ["y0", "b2"], ["y1"]),
        helper.make_node("Reshape", ["y1", "flat"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    file.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(file))


def run_onnx(file: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs from a plain ONNX Runtime session: the reference."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return list(ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"]).run(None, feeds))


def write_torchscript_mlp(file: Path, seed: int) -> nn.Module:
    """A TorchScript MLP (16 -> 32 -> 4); returns the module, the reference."""
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    file.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated upstream; archives still load
        torch.jit.trace(module, torch.zeros(2, 16)).save(str(file))  # type: ignore[no-untyped-call]
    return module


def build_triton_repo(dest: Path) -> ModelRepository:
    """The checked-in Triton-style repository (``tests/data/triton_repo``: one ``config.pbtxt`` per
    supported and unsupported case) with its model files written beside the configs."""
    shutil.copytree(TRITON_DATA, dest)
    write_mlp_onnx(dest / "onnx_mlp" / "1" / "model.onnx", seed=1)
    write_mlp_onnx(dest / "onnx_fixed" / "1" / "fixed.onnx", seed=2, batch=1)
    write_torchscript_mlp(dest / "torch_mlp" / "1" / "model.pt", seed=3)
    write_torchscript_mlp(dest / "torch_mlp" / "2" / "model.pt", seed=4)
    for name in ("ensemble_model", "python_model", "sequence_model", "tf_model", "string_input", "bad_dims"):
        write_mlp_onnx(dest / name / "1" / "model.onnx")  # a servable file: only the config is refused
    for version in (1, 2):
        write_mlp_onnx(dest / "two_versions" / str(version) / "model.onnx")
    return ModelRepository(dest)


SIMPLE_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
"""


def write_simple(root: Path, name: str = "simple", op: str = "Add") -> None:
    """Triton's first example model in Triton's layout: ``OUTPUT0 = INPUT0 + INPUT1``, ``OUTPUT1 = INPUT0 -
    INPUT1`` (INT32, 16 each), no weights at all; ``op`` another operator in place of Add (one the runtime
    lacks: a model that cannot register)."""
    import onnx
    from onnx import TensorProto, helper

    def tensor(tensor_name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(tensor_name, TensorProto.INT32, ["batch", 16])

    domain = "" if op == "Add" else "org.example.missing"
    nodes = [
        helper.make_node(op, ["INPUT0", "INPUT1"], ["OUTPUT0"], domain=domain),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    graph = helper.make_graph(nodes, name, [tensor("INPUT0"), tensor("INPUT1")], [tensor("OUTPUT0"), tensor("OUTPUT1")])
    opsets = [helper.make_opsetid("", 17), *([helper.make_opsetid(domain, 1)] if domain else [])]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(SIMPLE_CONFIG.format(name=name))
    onnx.save(model, str(root / name / "1" / "model.onnx"))
