"""Reading the project's Dockerfiles as Docker does: instructions (continuation lines joined), their
stages, and the exec forms and environment a container of the final stage starts with."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = (ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cuda")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ENV, ...
    arguments: str
    stage: int  # 0 for the first FROM's stage


def instructions(path: Path) -> list[Instruction]:
    text = re.sub(r"\\\n", " ", path.read_text())  # a trailing backslash continues the line
    found: list[Instruction] = []
    stage = -1
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        stage += keyword == "FROM"
        found.append(Instruction(keyword, " ".join(arguments.split()), stage))
    return found


def final_stage(path: Path) -> list[Instruction]:
    every = instructions(path)
    return [i for i in every if i.stage == every[-1].stage]


def exec_form(instructions_: list[Instruction], keyword: str) -> list[str]:
    """The JSON array form of the last ``keyword`` (ENTRYPOINT, CMD), as Docker runs it."""
    last = [i for i in instructions_ if i.keyword == keyword][-1]
    command = json.loads(last.arguments)
    assert isinstance(command, list) and all(isinstance(part, str) for part in command), last
    return command


def healthcheck(instructions_: list[Instruction]) -> list[str]:
    """The HEALTHCHECK's command (its exec form; the options before CMD left out)."""
    last = [i for i in instructions_ if i.keyword == "HEALTHCHECK"][-1]
    _, cmd, command = last.arguments.partition(" CMD ")
    assert cmd, f"HEALTHCHECK without CMD: {last.arguments}"
    parts = json.loads(command)
    assert isinstance(parts, list)
    return [str(part) for part in parts]


def environment(instructions_: list[Instruction]) -> dict[str, str]:
    """The ENV settings, ``$NAME`` references to earlier ones expanded (``PATH=/x:$PATH``)."""
    values: dict[str, str] = {}
    for instruction in instructions_:
        if instruction.keyword == "ENV":
            for pair in shlex.split(instruction.arguments):
                name, _, value = pair.partition("=")
                values[name] = re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), f"${m.group(1)}"), value)
    return values


def pinned(text: str, package: str) -> str | None:
    """The version ``package==VERSION`` pins in ``text`` (a Dockerfile's RUN or a requirements file)."""
    match = re.search(rf"(?<![\w-]){re.escape(package)}(?:\[[^\]]*\])?==([\w.+-]+)", text)
    return match.group(1) if match else None
