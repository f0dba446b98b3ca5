"""Checks of what goes into a batch and what comes out of a model, on any device."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mainspring.models.zoo import torch_dtype
from mainspring.protocol import Infer
from mainspring.protocol.models import ModelConfig
from mainspring.protocol.tensors import Sample, shape_matches


def check_batch(config: ModelConfig, action: Infer, samples: Sequence[Sample] | None) -> str:
    if action.batch_size not in config.batch_sizes:
        return f"batch size {action.batch_size} is not one of {list(config.batch_sizes)} for {config.name}"
    if len(action.request_ids) > action.batch_size:
        return f"{len(action.request_ids)} requests do not fit a batch of {action.batch_size}"
    if samples is None or len(samples) != len(action.request_ids):
        return f"expected inputs for {len(action.request_ids)} requests, got {0 if samples is None else len(samples)}"
    for i, sample in enumerate(samples):
        for spec in config.inputs:
            if spec.name not in sample:
                return f"request {action.request_ids[i]}: input {spec.name!r} is missing"
            try:
                spec.check_sample(sample[spec.name], f"request {action.request_ids[i]} input {spec.name!r}")
            except ValueError as error:
                return str(error)
    return ""


def check_outputs(config: ModelConfig, outputs: tuple[torch.Tensor, ...], batch: int) -> None:
    if len(outputs) != len(config.outputs):
        raise ValueError(f"the model returns {len(outputs)} outputs, its config names {len(config.outputs)}")
    for spec, tensor in zip(config.outputs, outputs, strict=True):
        if not shape_matches((batch, *spec.sample_shape), tuple(tensor.shape)):
            raise ValueError(
                f"output {spec.name!r}: the model returns shape {list(tensor.shape)}, config says {list(spec.shape)}"
            )
        if tensor.dtype != torch_dtype(spec.datatype):
            raise ValueError(f"output {spec.name!r}: the model returns {tensor.dtype}, config says {spec.datatype}")


def as_tuple(result: object) -> tuple[torch.Tensor, ...]:
    if isinstance(result, torch.Tensor):
        return (result,)
    if isinstance(result, list | tuple) and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(result)
    raise ValueError(f"the model returned {type(result).__name__}, expected a tensor or a tuple of tensors")
