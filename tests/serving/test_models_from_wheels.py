"""A model nobody here wrote, end to end: the example script assembles a Triton-layout repository
from the ONNX model the installed ``magika`` wheel ships, ``mainspring serve`` serves it as it is,
and unmodified ``tritonclient`` gets what ONNX Runtime computes on the same file directly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.onnx_models import SUPPORTED, build_triton_repo, run_onnx
from tests.serving.processes import ServerProcess

EXAMPLE = Path(__file__).parents[2] / "examples" / "triton_repository_from_wheels.py"


def magika_features(content: bytes) -> np.ndarray:
    """The model's input for a file: its first and last 1,024 bytes, padded with 256 (magika's own layout)."""
    begin = list(content[:1024]) + [256] * (1024 - len(content[:1024]))
    end = [256] * (1024 - len(content[-1024:])) + list(content[-1024:])
    return np.array([begin + end], dtype=np.int32)


@pytest.mark.slow
def test_a_model_from_a_wheel_is_served_from_a_triton_repository(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path / "repo")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    model_file = tmp_path / "repo" / "magika" / "1" / "model.onnx"
    labels = json.loads((model_file.parent / "labels.json").read_text())
    files = [EXAMPLE.read_bytes(), json.dumps({"a": [1, 2, 3]}).encode(), b"%PDF-1.7\n" + bytes(range(256)) * 8]
    batch = np.concatenate([magika_features(content) for content in files])
    (expected,) = run_onnx(model_file, {"bytes": batch})
    server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", "--slo-ms", "30000")
    try:
        server.wait_ready()
        http = httpclient.InferenceServerClient(server.http)
        assert http.is_model_ready("magika")
        metadata = http.get_model_metadata("magika")
        assert metadata["inputs"][0]["datatype"] == "INT32" and metadata["inputs"][0]["shape"] == [-1, 2048]
        tensor = httpclient.InferInput("bytes", list(batch.shape), "INT32")
        tensor.set_data_from_numpy(batch, binary_data=True)
        got = http.infer("magika", [tensor]).as_numpy("target_label")
        # Scores agree to float rounding: ONNX Runtime itself gives a row slightly different scores in a batch of
        # another size (other kernels; 1.6e-5 for the second row alone against in a batch of 3, measured).
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
        assert list(np.argmax(got, axis=1)) == list(np.argmax(expected, axis=1))
        assert labels[int(np.argmax(got[0]))] == "python"  # the example script itself
        grpc = grpcclient.InferenceServerClient(server.grpc)
        one = grpcclient.InferInput("bytes", [1, 2048], "INT32")
        one.set_data_from_numpy(batch[1:2])
        alone = grpc.infer("magika", [one]).as_numpy("target_label")
        np.testing.assert_allclose(alone, expected[1:2], rtol=1e-3, atol=1e-4)
        assert labels[int(np.argmax(alone[0]))] == "json"
    finally:
        assert server.stop() == 0, (tmp_path / "server.log").read_text()


@pytest.mark.parametrize("size", [0, 5, 5000])
def test_the_features_follow_magikas_layout(size: int) -> None:
    features = magika_features(bytes(range(256)) * 20 if size == 5000 else b"x" * size)
    assert features.shape == (1, 2048) and features.dtype == np.int32
    assert (features[0, :1024] == 256).sum() == max(0, 1024 - size)


@pytest.mark.slow
def test_a_triton_repository_is_served_and_its_refusals_listed(tmp_path: Path) -> None:
    repo = build_triton_repo(tmp_path / "repo")
    server = ServerProcess(repo.root, tmp_path / "server.log", "--slo-ms", "30000")
    try:
        server.wait_ready()
        http = httpclient.InferenceServerClient(server.http)
        index = {entry["name"]: entry for entry in http.get_model_repository_index()}
        assert {n for n, e in index.items() if e["state"] == "READY"} == set(SUPPORTED)
        assert "sequence_batching" in index["sequence_model"]["reason"]
        assert "version_policy all" in index["two_versions"]["reason"]
        x = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)
        tensor = httpclient.InferInput("x", [3, 16], "FP32")
        tensor.set_data_from_numpy(x)
        (expected,) = run_onnx(repo.model_file("onnx_mlp"), {"x": x})
        np.testing.assert_allclose(http.infer("onnx_mlp", [tensor]).as_numpy("y"), expected, rtol=1e-5, atol=1e-6)
        # Triton's platform names, in metadata and config alike (was: "pytorch_onnx", "pytorch_torchscript")
        assert http.get_model_metadata("onnx_mlp")["platform"] == "onnxruntime_onnx"
        assert http.get_model_config("torch_mlp")["platform"] == "pytorch_libtorch"
        # classification names the classes from the config's label_filename, as Triton does
        wanted = httpclient.InferRequestedOutput("y", class_count=2)
        top = http.infer("onnx_mlp", [tensor], outputs=[wanted]).as_numpy("y")
        labels = ["cat", "dog", "bird", "fish"]
        for row, answer in zip(expected, top, strict=True):
            best = np.argsort(-row, kind="stable")[:2]
            assert [e.decode().split(":")[1:] for e in answer] == [[str(i), labels[i]] for i in best]
        http.unload_model("onnx_mlp")  # the repository API on a Triton layout
        assert not http.is_model_ready("onnx_mlp")
        http.load_model("onnx_mlp")
        http.load_model("onnx_mlp")  # served and unchanged: a load is nothing to do, not a refusal
        np.testing.assert_allclose(http.infer("onnx_mlp", [tensor]).as_numpy("y"), expected, rtol=1e-5, atol=1e-6)
    finally:
        assert server.stop() == 0, (tmp_path / "server.log").read_text()
