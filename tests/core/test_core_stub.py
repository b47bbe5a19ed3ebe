"""dpsql/_core.pyi declares every public name of the compiled dpsql._core, and nothing else."""

from __future__ import annotations

import ast
from pathlib import Path

import dpsql
from dpsql import _core

STUB = Path(dpsql.__file__).with_name("_core.pyi")


def _stub_names() -> set[str]:
    names: set[str] = set()
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_stub_matches_the_compiled_module() -> None:
    public = {
        name
        for name, value in vars(_core).items()
        if not name.startswith("_") and getattr(value, "__name__", None) not in ("numpy", "os")
    }
    assert _stub_names() == public


def test_stub_ships_with_the_package() -> None:
    assert STUB.is_file()
    assert STUB.with_name("py.typed").is_file()
