"""Built-in zoo: architectures defined in plain torch, seeded random weights, no downloads.

ResNet-18/50 match torchvision's parameter counts (11,689,512 and 25,557,032 with
1000 classes); the image size is free, so a small input makes them fast on a CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from mainspring.protocol.tensors import TensorSpec, numpy_dtype


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]


class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, width, 3, stride)
        self.conv2, self.bn2 = _conv_bn(width, width, 3)
        self.downsample = _shortcut(cin, width * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(_tensor(self.bn2(self.conv2(y))) + _tensor(self.downsample(x)))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, width, 1)
        self.conv2, self.bn2 = _conv_bn(width, width, 3, stride)
        self.conv3, self.bn3 = _conv_bn(width, width * self.expansion, 1)
        self.downsample = _shortcut(cin, width * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(_tensor(self.bn3(self.conv3(y))) + _tensor(self.downsample(x)))


def _tensor(value: object) -> torch.Tensor:
    """A module call's result, typed (``nn.Module.__call__`` is untyped)."""
    assert isinstance(value, torch.Tensor)
    return value


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(*_conv_bn(cin, cout, 1, stride))


class ResNet(nn.Module):
    def __init__(self, block: type[_BasicBlock | _Bottleneck], layers: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        stages: list[nn.Module] = []
        cin = 64
        for index, count in enumerate(layers):
            width = 64 * 2**index
            for i in range(count):
                stages.append(block(cin, width, 2 if i == 0 and index > 0 else 1))
                cin = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _tensor(self.fc(torch.flatten(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1), 1)))


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [*_conv_bn(cin, hidden, 1), nn.ReLU6()]
        layers += [*_conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.ReLU6(), *_conv_bn(hidden, cout, 1)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _tensor(self.body(x))
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    """MobileNetV2's inverted-residual layout (expansion, channels, repeats, stride) at width 1.0."""

    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 32, 3, 2), nn.ReLU6()]
        cin = 32
        for expand, cout, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(_InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers += [*_conv_bn(cin, 1280, 1), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _tensor(self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1)))


class _EncoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.ff1 = nn.Linear(hidden, intermediate)
        self.ff2 = nn.Linear(intermediate, hidden)
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, length, hidden)
        x = _tensor(self.norm1(x + _tensor(self.out(attended))))
        return _tensor(self.norm2(x + _tensor(self.ff2(F.gelu(_tensor(self.ff1(x)))))))


BERT_VOCAB = 30522  # BERT's WordPiece vocabulary


class TransformerEncoder(nn.Module):
    """BERT-tiny scale: token ids in, the first token's final hidden state (pooled, tanh) out."""

    def __init__(self, vocab: int = BERT_VOCAB, hidden: int = 128, layers: int = 2, heads: int = 2, seq_len: int = 128):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(seq_len, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.layers = nn.Sequential(*(_EncoderLayer(hidden, heads, 4 * hidden) for _ in range(layers)))
        self.pool = nn.Linear(hidden, hidden)
        self.register_buffer("position_ids", torch.arange(seq_len).unsqueeze(0), persistent=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = _tensor(self.position_ids)
        x = self.norm(self.tokens(ids) + self.positions(positions[:, : ids.shape[1]]))
        return torch.tanh(_tensor(self.pool(_tensor(self.layers(x))[:, 0])))


class MLP(nn.Module):
    def __init__(self, features: int = 256, hidden: int = 512, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _tensor(self.body(x))


@dataclass(frozen=True)
class Architecture:
    """How to build a zoo model and what its inputs and outputs look like, from a few integer arguments."""

    build: Callable[[Mapping[str, int]], nn.Module]
    inputs: Callable[[Mapping[str, int]], tuple[TensorSpec, ...]]
    outputs: Callable[[Mapping[str, int]], tuple[TensorSpec, ...]]
    defaults: Mapping[str, int]


def _image(args: Mapping[str, int]) -> tuple[TensorSpec, ...]:
    size = args["image_size"]
    return (TensorSpec("input", "FP32", (-1, 3, size, size)),)


def _logits(args: Mapping[str, int]) -> tuple[TensorSpec, ...]:
    return (TensorSpec("logits", "FP32", (-1, args["classes"])),)


ARCHITECTURES: Mapping[str, Architecture] = {
    "resnet18": Architecture(
        lambda a: ResNet(_BasicBlock, [2, 2, 2, 2], a["classes"]), _image, _logits, {"image_size": 64, "classes": 1000}
    ),
    "resnet50": Architecture(
        lambda a: ResNet(_Bottleneck, [3, 4, 6, 3], a["classes"]), _image, _logits, {"image_size": 64, "classes": 1000}
    ),
    "mobilenetv2": Architecture(
        lambda a: MobileNetV2(a["classes"]), _image, _logits, {"image_size": 64, "classes": 1000}
    ),
    "bert_tiny": Architecture(
        lambda a: TransformerEncoder(seq_len=a["seq_len"]),
        lambda a: (TensorSpec("input_ids", "INT64", (-1, a["seq_len"]), valid_range=(0, BERT_VOCAB - 1)),),
        lambda a: (TensorSpec("pooled", "FP32", (-1, 128)),),
        {"seq_len": 32},
    ),
    "mlp": Architecture(
        lambda a: MLP(a["features"], 512, a["classes"]),
        lambda a: (TensorSpec("input", "FP32", (-1, a["features"])),),
        _logits,
        {"features": 256, "classes": 10},
    ),
}


def architecture(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; choose from {', '.join(ARCHITECTURES)}") from None


def build_model(name: str, args: Mapping[str, int] | None = None, seed: int = 0) -> nn.Module:
    """The architecture with seeded random weights (and non-trivial BatchNorm statistics), in eval mode."""
    arch = architecture(name)
    full = {**arch.defaults, **(args or {})}
    unknown = set(full) - set(arch.defaults)
    if unknown:
        raise ValueError(f"zoo model {name!r} has no argument(s) {', '.join(sorted(unknown))}")
    generator = torch.manual_seed(seed)
    model = arch.build(full)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            # Random statistics so a wrong weight binding changes the output (identity BN would hide it).
            _tensor(module.running_mean).uniform_(-0.1, 0.1, generator=generator)
            _tensor(module.running_var).uniform_(0.5, 1.5, generator=generator)
        elif isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, generator=generator, nonlinearity="relu")
            module.weight.data.mul_(1 / math.sqrt(2))
    return model.eval()


def torch_dtype(datatype: str) -> torch.dtype:
    """The torch dtype of a KServe datatype (``FP32`` -> ``torch.float32``)."""
    return torch.from_numpy(np.zeros(0, dtype=numpy_dtype(datatype))).dtype


def example_inputs(specs: tuple[TensorSpec, ...], batch: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random inputs of the given batch: normal floats, small non-negative integers (valid token ids)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for spec in specs:
        shape = (batch, *spec.sample_shape)
        dtype = torch_dtype(spec.datatype)  # the model's own
        if spec.datatype.startswith("FP"):
            tensors.append(torch.randn(shape, generator=generator).to(dtype))
        else:
            tensors.append(torch.randint(0, 100, shape, generator=generator).to(dtype))
    return tuple(tensors)
