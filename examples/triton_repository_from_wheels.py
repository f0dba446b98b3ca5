"""Assemble a Triton-layout model repository from ONNX models that installed wheels ship.

Nothing is downloaded: the models come from packages already installed (``pip install magika``,
Google's file-type classifier: a byte-level network, ~3 MB of ONNX). For each, the graph's own
input and output names, datatypes and shapes are read with ``onnx`` and written as Triton's
``config.pbtxt`` beside ``1/model.onnx``; the wheel's label file is copied next to the model.

    python examples/triton_repository_from_wheels.py OUT_DIR
    mainspring serve --repo OUT_DIR

Then any KServe v2 client (``tritonclient``) can call ``magika``: input ``bytes`` (INT32, the first
and last 1,024 bytes of a file, 256 for padding), output ``target_label`` (FP32 scores over the
labels in ``1/labels.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
from importlib import resources
from pathlib import Path

# ONNX TensorProto element types -> Triton config data types
TRITON_TYPES = {1: "TYPE_FP32", 6: "TYPE_INT32", 7: "TYPE_INT64", 10: "TYPE_FP16", 11: "TYPE_FP64", 2: "TYPE_UINT8"}


def magika_model() -> tuple[Path, list[str]]:
    """The newest model folder inside the installed ``magika`` package and its labels."""
    root = Path(str(resources.files("magika"))) / "models"
    folders = sorted(p.parent for p in root.glob("*/model.onnx"))
    if not folders:
        raise SystemExit(f"no ONNX model inside the installed magika package ({root})")
    config = json.loads((folders[-1] / "config.min.json").read_text())
    return folders[-1] / "model.onnx", list(config["target_labels_space"])


def triton_config(name: str, model: Path, max_batch_size: int) -> str:
    """``config.pbtxt`` for ``model`` as its graph declares it (the first dimension is the batch)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    constants = {i.name for i in graph.initializer}

    def tensors(values: list[onnx.ValueInfoProto]) -> str:
        entries = []
        for value in values:
            tensor = value.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim][1:]
            datatype = TRITON_TYPES[tensor.elem_type]
            entries.append(f'  {{ name: "{value.name}" data_type: {datatype} dims: [ {", ".join(map(str, dims))} ] }}')
        return ",\n".join(entries)

    inputs = [i for i in graph.input if i.name not in constants]
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        f"input [\n{tensors(inputs)}\n]\noutput [\n{tensors(list(graph.output))}\n]\n"
        "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
    )


def build(out: Path, max_batch_size: int = 8) -> list[str]:
    """Write the repository into ``out``; returns the model names."""
    model, labels = magika_model()
    folder = out / "magika"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, folder / "1" / "model.onnx")
    (folder / "1" / "labels.json").write_text(json.dumps(labels) + "\n")
    (folder / "config.pbtxt").write_text(
        f"# Built by examples/triton_repository_from_wheels.py from {model}\n"
        + triton_config("magika", model, max_batch_size)
    )
    return ["magika"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the repository folder to write (created if missing)")
    parser.add_argument("--max-batch-size", type=int, default=8)
    args = parser.parse_args()
    for name in build(args.out, args.max_batch_size):
        print(f"{args.out / name}: config.pbtxt and 1/model.onnx")


if __name__ == "__main__":
    main()
