"""``benchmarks/policy_compiled.py``: the compiled copy is the one its side imports, and decides alike."""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import policy_compiled

needs_compiler = pytest.mark.skipif(
    shutil.which("cc") is None or not Path(sysconfig.get_paths()["include"], "Python.h").exists(),
    reason="needs a C compiler and Python's headers",
)


@needs_compiler
def test_a_compiled_module_is_imported_from_the_copy_and_decides_as_the_plain_one(tmp_path: Path) -> None:
    compiled = policy_compiled.compile_copy(tmp_path, ["due.py"])  # the smallest module: a quick build
    assert compiled == ["due.py"]
    assert list((tmp_path / policy_compiled.POLICY_DIR).glob("due.*.so"))
    plain = policy_compiled.run_side(policy_compiled.PACKAGE.parent, 2, 250.0, 0.3, 0.3)
    built = policy_compiled.run_side(tmp_path, 2, 250.0, 0.3, 0.3)
    assert (plain["compiled_modules"], built["compiled_modules"]) == (0.0, 1.0)
    assert (plain["offered"], plain["goodput"]) == (built["offered"], built["goodput"])
    assert plain["goodput"] > 0


def test_compile_copy_says_what_mypyc_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="mypyc failed"):
        policy_compiled.compile_copy(tmp_path, ["no_such_module.py"])
