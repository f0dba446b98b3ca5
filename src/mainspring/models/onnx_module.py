"""An ONNX model served through ONNX Runtime with its weights in the worker's page pool.

The worker pages a model by pointing its module's parameters and buffers at page views
(``TorchDevice._bind``). ``OnnxModule`` fits that: at load time its weight initializers are
taken out of the graph and made graph inputs, held as torch buffers; every run binds each
of them, by address, to wherever the buffer points now (``IOBinding``), so ``LoadWeights``
stays a memory copy into pages and ``EvictWeights`` frees them, as for PyTorch. Small
integer initializers (shapes, axes, indices) stay in the graph: operators read them as
constants while planning. The session is made on the first run, on the device the buffers
are on (CUDA or CPU execution provider), with the exec lane's thread count.

On CUDA, ONNX Runtime runs on a stream of its own and does not wait for the torch stream that
wrote the bound inputs (``Run`` with an IOBinding does not synchronize them): each run waits for
the current (exec) stream first. A session that asked for the CUDA provider and got the CPU one
(onnxruntime lists CUDA when its libraries then fail to load, and the CPU package installed beside
``onnxruntime-gpu`` hides it) is refused, not served silently on the CPU. Its memory arena grows
only as far as it needs (``kSameAsRequested``) and at most ``ARENA_LIMIT_BYTES``: it lives outside
the page pool.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import torch
from torch import nn

from mainspring.models.errors import ModelLoadError

# Floating initializers of at least this many elements become paged inputs.
PAGED_MIN_ELEMENTS = 16
# A CUDA session's arena (activations, workspaces: the weights are in the page pool) at most this large.
ARENA_LIMIT_BYTES = 2 * 1024**3
CUDA_PROVIDER = "CUDAExecutionProvider"
_FLOAT_TYPES = {1, 10, 11}  # ONNX TensorProto FLOAT, FLOAT16, DOUBLE


def fixed_batch(graph: onnx.GraphProto, input_name: str | None = None) -> int | None:
    """The batch dimension of ``input_name`` (default: the graph's first input that is not an
    initializer) when the graph fixes it, else None: such a model is served at that size only."""
    constants = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if (i.name == input_name if input_name else i.name not in constants)]
    dims = inputs[0].type.tensor_type.shape.dim if inputs else []
    return int(dims[0].dim_value) if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0 else None


class OnnxModule(nn.Module):
    """``forward(*inputs)`` in the order of ``input_names``; returns the outputs in ``output_names`` order."""

    cuda_graphs = False  # ONNX Runtime launches its own kernels: nothing for torch to capture

    def __init__(self, file: Path, input_names: tuple[str, ...], output_names: tuple[str, ...]) -> None:
        super().__init__()
        from onnx import numpy_helper

        model = onnx.load(str(file))
        graph = model.graph
        declared = {i.name for i in graph.input}
        missing = [name for name in input_names if name not in declared]
        missing += [name for name in output_names if name not in {o.name for o in graph.output}]
        if missing:
            raise ModelLoadError(f"{file}: the graph has no tensor named {missing[0]!r} (its inputs: "
                                 f"{sorted(declared)}, outputs: {[o.name for o in graph.output]})")  # fmt: skip
        self.input_names = input_names
        self.output_names = output_names
        self.fixed_batch = fixed_batch(graph, input_names[0])
        self.weight_names: list[str] = []
        kept = []
        for index, initializer in enumerate(graph.initializer):
            if initializer.data_type not in _FLOAT_TYPES or int(np.prod(initializer.dims)) < PAGED_MIN_ELEMENTS:
                kept.append(initializer)
                continue
            array = numpy_helper.to_array(initializer)
            # torch buffer names cannot hold ONNX's punctuation: the order keeps the mapping
            self.register_buffer(f"w{index}", torch.from_numpy(np.ascontiguousarray(array).copy()))
            self.weight_names.append(initializer.name)
            if initializer.name not in declared:
                graph.input.append(
                    onnx.helper.make_tensor_value_info(initializer.name, initializer.data_type, list(initializer.dims))
                )
        del graph.initializer[:]
        graph.initializer.extend(kept)
        self._graph = model.SerializeToString()
        self._session: Any = None
        self._session_device: torch.device | None = None

    def _session_for(self, device: torch.device) -> Any:
        if self._session is None or self._session_device != device:
            ort = onnxruntime
            options = ort.SessionOptions()
            options.intra_op_num_threads = torch.get_num_threads()
            options.inter_op_num_threads = 1
            options.log_severity_level = 3  # warnings about unused initializers would flood the worker log
            providers: list[Any] = ["CPUExecutionProvider"]
            if device.type == "cuda":
                if CUDA_PROVIDER not in ort.get_available_providers():
                    raise RuntimeError(f"ONNX on a CUDA device needs the onnxruntime-gpu package: {_GPU_PACKAGE}")
                providers.insert(0, (CUDA_PROVIDER, {
                    "device_id": device.index or 0, "gpu_mem_limit": ARENA_LIMIT_BYTES,
                    "arena_extend_strategy": "kSameAsRequested",
                }))  # fmt: skip
            with warnings.catch_warnings(record=True) as said:  # a provider it cannot use is a warning there
                warnings.simplefilter("always")
                session = ort.InferenceSession(self._graph, options, providers=providers)
            if device.type == "cuda" and CUDA_PROVIDER not in session.get_providers():
                told = "; ".join(str(w.message) for w in said)
                raise RuntimeError(
                    f"ONNX Runtime did not take the CUDA provider for {device} and would run on the CPU "
                    f"({told or 'its CUDA libraries did not load'}): {_GPU_PACKAGE}"
                )
            self._session, self._session_device = session, device
        return self._session

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        weights = list(self.buffers())
        device = inputs[0].device if inputs else weights[0].device
        session = self._session_for(device)
        binding = session.io_binding()
        kind, index = ("cuda", device.index or 0) if device.type == "cuda" else ("cpu", 0)
        names = [*self.input_names, *self.weight_names]
        held = [t.contiguous() for t in (*inputs, *weights)]  # no copies for the worker's buffers and page views
        for name, tensor in zip(names, held, strict=True):
            binding.bind_input(name, kind, index, _NUMPY[tensor.dtype], tuple(tensor.shape), tensor.data_ptr())
        for name in self.output_names:
            binding.bind_output(name, kind, index)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # the inputs' writes are done before ORT reads them
        session.run_with_iobinding(binding)
        return tuple(torch.from_numpy(array).to(device) for array in binding.copy_outputs_to_cpu())


_GPU_PACKAGE = (
    "pip install 'mainspring[onnx-gpu]' (onnxruntime-gpu, with the CUDA and cuDNN libraries it names), and "
    "uninstall onnxruntime, the CPU package, which hides the CUDA provider when both are installed"
)

_NUMPY: dict[torch.dtype, type] = {
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.float64: np.float64,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}
