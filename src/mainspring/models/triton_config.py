"""Triton model repositories as they are: ``<repo>/<model>/config.pbtxt`` beside numbered versions.

``config.pbtxt`` is parsed with the model-config definitions that ship with ``tritonclient``
(text protobuf), and turned into a ``ModelConfig``: ``platform``/``backend`` pick the format
(``onnxruntime_onnx`` -> ONNX, ``pytorch_libtorch`` -> TorchScript), ``default_model_filename``
the file, ``max_batch_size`` and ``dynamic_batching.preferred_batch_size`` the batch sizes,
inputs and outputs their datatypes and shapes (Triton's ``dims`` leave out the batch dimension
when the model batches). What Mainspring cannot honour is refused with the field named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mainspring.models.errors import ModelLoadError
from mainspring.protocol.models import ModelConfig
from mainspring.protocol.tensors import DATATYPES, TensorSpec

TRITON_CONFIG = "config.pbtxt"
# platform or backend -> (format, Triton's default model file name)
SUPPORTED = {
    "onnxruntime_onnx": ("onnx", "model.onnx"),
    "onnxruntime": ("onnx", "model.onnx"),
    "pytorch_libtorch": ("torchscript", "model.pt"),
    "pytorch": ("torchscript", "model.pt"),
}
DEFAULT_BATCH_SIZES = (1, 2, 4, 8)


def parse_triton_config(text: str, source: Path) -> Any:
    """The ``ModelConfig`` protobuf message; ``ModelLoadError`` names the file and the parse error."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as error:
        raise ModelLoadError(f"bad config {source}: {error}") from None


def served_version(folder: Path, versions: list[int]) -> int:
    """The version ``version_policy`` selects among ``versions`` (one: Mainspring serves one per model)."""
    file = folder / TRITON_CONFIG
    message = parse_triton_config(file.read_text(), file)
    policy = message.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "specific":
        wanted = list(policy.specific.versions)
        if len(wanted) != 1:
            raise ModelLoadError(f"{file}: version_policy specific lists {wanted}; Mainspring serves one version")
        if wanted[0] not in versions:
            raise ModelLoadError(f"{file}: version_policy names version {wanted[0]}, not one of {versions}")
        return int(wanted[0])
    if choice == "all" and len(versions) > 1:
        raise ModelLoadError(f"{file}: version_policy all with versions {versions}; Mainspring serves one version")
    if choice == "latest" and policy.latest.num_versions > 1:
        raise ModelLoadError(f"{file}: version_policy latest num_versions {policy.latest.num_versions}; "
                             "Mainspring serves one version")  # fmt: skip
    if not versions:
        raise ModelLoadError(f"{file}: no numbered version folder beside it")
    return versions[-1]


def read_triton_config(folder: Path, version_folder: Path) -> ModelConfig:
    """``folder/config.pbtxt`` as a ``ModelConfig`` for the model file in ``version_folder``."""
    file = folder / TRITON_CONFIG
    message = parse_triton_config(file.read_text(), file)
    name = message.name or folder.name
    if name != folder.name:
        raise ModelLoadError(f"bad config {file}: name {name!r} does not match its folder {folder.name!r}")
    _refuse_unsupported(message, file)
    engine = message.platform or message.backend
    format_, default_file = SUPPORTED[engine]
    model_file = message.default_model_filename or default_file
    batching = message.max_batch_size > 0
    inputs = tuple(_tensor(t, batching, file, "input") for t in message.input)
    outputs = tuple(_tensor(t, batching, file, "output") for t in message.output)
    if batching:
        preferred = set(message.dynamic_batching.preferred_batch_size)
        if any(not 0 < b <= message.max_batch_size for b in preferred):
            raise ModelLoadError(f"{file}: dynamic_batching preferred_batch_size {sorted(preferred)} must lie in "
                                 f"[1, max_batch_size {message.max_batch_size}]")  # fmt: skip
        sizes = preferred or {b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b < message.max_batch_size}
        batch_sizes = tuple(sorted(sizes | {1, message.max_batch_size}))  # 1: a lone request is not padded
    else:  # no batching: the first dimension is part of the shape; batch along it only if it may vary
        batch_sizes = DEFAULT_BATCH_SIZES if all(t.dims[0] == -1 for t in message.input) else (1,)
    if format_ == "onnx":
        fixed = _onnx_fixed_batch(version_folder / model_file)
        if fixed is not None:
            if batching and fixed > message.max_batch_size:
                raise ModelLoadError(f"{file}: the ONNX graph's batch dimension is fixed at {fixed}, above "
                                     f"max_batch_size {message.max_batch_size}")  # fmt: skip
            batch_sizes = (fixed,)  # a fixed batch dimension: served at that size only
    try:
        return ModelConfig(name, format_, model_file, inputs, outputs, batch_sizes)
    except ValueError as error:
        raise ModelLoadError(f"bad config {file}: {error}") from None


def _refuse_unsupported(message: Any, file: Path) -> None:
    engine = message.platform or message.backend
    if message.platform == "ensemble" or message.HasField("ensemble_scheduling"):
        raise ModelLoadError(f"{file}: platform ensemble (ensemble_scheduling) is not supported")
    if message.backend == "python":
        raise ModelLoadError(f"{file}: backend python (the Python backend) is not supported")
    if engine not in SUPPORTED:
        raise ModelLoadError(f"{file}: platform/backend {engine!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED)}")  # fmt: skip
    if message.HasField("sequence_batching"):
        raise ModelLoadError(f"{file}: sequence_batching is not supported (Mainspring batches independent requests)")
    if not message.input or not message.output:
        raise ModelLoadError(f"{file}: input and output must each list at least one tensor")


def _tensor(tensor: Any, batching: bool, file: Path, kind: str) -> TensorSpec:
    from tritonclient.grpc import model_config_pb2

    where = f"{file}: {kind} {tensor.name!r}"
    if tensor.HasField("reshape"):
        raise ModelLoadError(f"{where}: reshape is not supported")
    if kind == "input" and (tensor.is_shape_tensor or tensor.optional or tensor.allow_ragged_batch):
        raise ModelLoadError(f"{where}: is_shape_tensor, optional and allow_ragged_batch are not supported")
    datatype = model_config_pb2.DataType.Name(tensor.data_type).removeprefix("TYPE_")
    if datatype not in DATATYPES:
        raise ModelLoadError(f"{where}: data_type TYPE_{datatype} is not supported; supported: "
                             f"{', '.join('TYPE_' + d for d in DATATYPES)}")  # fmt: skip
    dims = tuple(int(d) for d in tensor.dims)
    if not batching and (not dims or dims[0] not in (1, -1)):
        raise ModelLoadError(f"{where}: dims {list(dims)} with max_batch_size 0: Mainspring batches along the first "
                             "dimension, which must then be 1 or -1")  # fmt: skip
    shape = (-1, *dims) if batching else (-1, *dims[1:])
    if -1 in shape[1:]:
        raise ModelLoadError(f"{where}: dims {list(dims)}: a variable size beyond the batch dimension is not "
                             "supported (every batch size is warmed up and profiled at one shape)")  # fmt: skip
    labels: tuple[str, ...] = ()
    if kind == "output" and tensor.label_filename:
        try:
            labels = tuple(line.strip() for line in (file.parent / tensor.label_filename).read_text().splitlines())
        except (OSError, UnicodeDecodeError) as error:
            raise ModelLoadError(f"{where}: cannot read label_filename {tensor.label_filename!r}: {error}") from None
    try:
        return TensorSpec(tensor.name, datatype, shape, labels=labels)
    except ValueError as error:
        raise ModelLoadError(f"{where}: {error}") from None


def _onnx_fixed_batch(model_file: Path) -> int | None:
    """The first input's batch dimension when the ONNX graph fixes it; None when it varies (or no file)."""
    if not model_file.is_file():
        return None
    try:
        import onnx

        from mainspring.models.onnx_module import fixed_batch
    except ModuleNotFoundError:
        return None  # the loader refuses the model naming the missing package
    try:
        graph = onnx.load(str(model_file), load_external_data=False).graph
    except Exception as error:  # the worker names the file again when it loads it; here only the shape matters
        raise ModelLoadError(f"{model_file}: not an ONNX model ({type(error).__name__})") from None
    return fixed_batch(graph)
