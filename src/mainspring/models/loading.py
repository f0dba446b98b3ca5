"""Turn a repository entry into a torch module, and write zoo models into a repository.

Nothing here unpickles arbitrary Python: ``torch.export`` programs and TorchScript
archives are read by their own loaders, safetensors is plain tensors.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec
import torch
from torch import nn
from torch.jit._trace import TracerWarning

from mainspring.models.errors import ModelLoadError
from mainspring.models.repository import ModelRepository
from mainspring.models.zoo import architecture, build_model, example_inputs
from mainspring.protocol.models import ModelConfig


def load_module(
    repo: ModelRepository, model: str, version: int | None = None, device: torch.device | None = None
) -> tuple[ModelConfig, nn.Module]:
    """The model's config and module (eval mode); ``ModelLoadError`` names the file and the reason. ``device``:
    where it will run, for a format that fixes devices in its graph (torch.export): such a module is moved there,
    weights and all; the others' weights are on the CPU."""
    config = repo.config(model, version)
    file = repo.model_file(model, version)
    if not file.is_file():
        raise ModelLoadError(f"model {model!r}: file {file} does not exist")
    try:
        module = _read(config, file, device)
    except ModelLoadError:
        raise
    except Exception as error:  # every loader has its own error types; all mean "this file cannot be served"
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelLoadError(f"model {model!r}: cannot load {file}: {reason}") from error
    if config.format != "torch_export":  # an exported program is already in inference form; eval() raises
        module.eval()
    return config, module


def _read(config: ModelConfig, file: Path, device: torch.device | None = None) -> nn.Module:
    if config.format == "torch_export":
        program = torch.export.load(file)
        if device is not None and device.type != "cpu":
            # Export fixes the device of what the graph makes itself (torch.ones(..., device=...)) as the one it
            # was exported on (pytorch#151010); moving the parameters alone leaves those on the CPU.
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
        exported: nn.Module = program.module()
        return exported
    if config.format == "onnx":
        try:
            from mainspring.models.onnx_module import OnnxModule
        except ModuleNotFoundError as absent:
            raise ModelLoadError(f"{file}: format onnx needs {absent.name}: pip install 'mainspring[onnx]'") from None

        names = tuple(spec.name for spec in config.inputs), tuple(spec.name for spec in config.outputs)
        onnx_module = OnnxModule(file, *names)
        fixed = onnx_module.fixed_batch
        if fixed is not None and config.batch_sizes != (fixed,):
            raise ModelLoadError(f"{file}: the graph fixes the batch dimension at {fixed}: batch_sizes must be "
                                 f"[{fixed}], not {list(config.batch_sizes)}")  # fmt: skip
        return onnx_module
    if config.format == "torchscript":
        with warnings.catch_warnings():  # TorchScript is deprecated upstream; existing archives still load
            warnings.simplefilter("ignore", DeprecationWarning)
            scripted: nn.Module = torch.jit.load(file, map_location="cpu")  # type: ignore[no-untyped-call]
        return scripted
    from safetensors.torch import load_file

    assert config.architecture is not None
    module = build_model(config.architecture, config.architecture_args)
    state = load_file(file)
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"{file}: missing tensors {missing[:3]}, unexpected tensors {unexpected[:3]}")
    return module


def state_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, each once: what a load copies into pages."""
    tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    return tensors


def export_zoo_model(
    repo: ModelRepository,
    name: str,
    *,
    fmt: str = "torch_export",
    args: Mapping[str, int] | None = None,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    served_as: str | None = None,
    seed: int = 0,
) -> ModelConfig:
    """Write zoo model ``name`` as a real model file in ``fmt`` (version 1 of ``served_as``, default ``name``)."""
    arch = architecture(name)
    full_args = {**arch.defaults, **(args or {})}
    module = build_model(name, full_args, seed)
    inputs, outputs = arch.inputs(full_args), arch.outputs(full_args)
    files = {
        "torch_export": "model.pt2",
        "torchscript": "model.pt",
        "safetensors": "model.safetensors",
        "onnx": "model.onnx",
    }
    if fmt not in files:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(files)}")
    config = ModelConfig(
        name=served_as or name,
        format=fmt,
        file=files[fmt],
        inputs=inputs,
        outputs=outputs,
        batch_sizes=tuple(batch_sizes),
        architecture=name if fmt == "safetensors" else None,
        architecture_args=dict(full_args) if fmt == "safetensors" else {},
    )
    folder = repo.write(config)
    example = example_inputs(inputs, min(2, max(batch_sizes)), seed)
    target = folder / config.file
    with torch.no_grad():
        if fmt == "torch_export":
            batch = torch.export.Dim("batch", min=1, max=max(max(batch_sizes), 2))
            dynamic = tuple({0: batch} for _ in inputs)
            torch.export.save(torch.export.export(module, example, dynamic_shapes=dynamic), target)
        elif fmt == "torchscript":
            with warnings.catch_warnings():
                # PyTorch deprecates TorchScript (we still serve existing archives), and the tracer warns about
                # shapes read as Python ints (the batch dimension stays dynamic: the tests run every batch size).
                warnings.simplefilter("ignore", TracerWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                traced = torch.jit.trace(module, example)  # type: ignore[no-untyped-call]
            traced.save(str(target))
        elif fmt == "onnx":
            with warnings.catch_warnings():  # the TorchScript-based exporter: the newer one needs onnxscript
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", TracerWarning)
                names = [s.name for s in inputs], [s.name for s in outputs]
                batch_axes = {name: {0: "batch"} for name in [*names[0], *names[1]]}
                torch.onnx.export(module, example, str(target), input_names=names[0], output_names=names[1],
                                  dynamic_axes=batch_axes, dynamo=False, opset_version=17)  # fmt: skip
        else:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in state_tensors(module).items()}, str(target))
    return config


def copy_model(repo: ModelRepository, source: str, copy_name: str) -> ModelConfig:
    """Another model with the same file and config under a new name (as Clockwork's experiments copy models)."""
    config = repo.config(source)
    copied = msgspec.structs.replace(config, name=copy_name)
    folder = repo.write(copied)
    shutil.copyfile(repo.path(source) / config.file, folder / config.file)
    return copied
