"""The modules of the dpsql package import each other without a cycle (issue 45).

The accounting modules once imported each other in a circle of five files, lazily inside
functions to dodge the import-time failure ("it imports this module"). Such a circle has no
order to read or test its parts in, and a module cannot be changed without the others. Here every
``import`` of a dpsql module anywhere in a file counts, inside functions too, except

- the block ``if TYPE_CHECKING:``, which never runs (annotations only), and
- the block ``if __name__ == "__main__":``, which runs only as the program ``python -m dpsql.x``:
  in a module named ``__main__``, not in ``dpsql.x``, so what it imports is imported by nobody.

No database needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dpsql"


def _is_guard(node: ast.stmt) -> bool:
    """``if TYPE_CHECKING:`` or ``if __name__ == "__main__":`` (see the module's docstring)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    if isinstance(test, ast.Name | ast.Attribute):
        name = test.id if isinstance(test, ast.Name) else test.attr
        return name == "TYPE_CHECKING"
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _statements(tree: ast.Module) -> list[ast.AST]:
    """Every statement of the module but the guarded blocks (their ``else`` branches count)."""
    out: list[ast.AST] = []
    for node in tree.body:
        if _is_guard(node):
            assert isinstance(node, ast.If)
            out.extend(node.orelse)
        else:
            out.append(node)
    return out


def _target(module: str, modules: set[str]) -> str | None:
    """The dpsql module that ``import module`` runs (a submodule, else the package), or None."""
    while module:
        if module in modules:
            return module
        module = module.rpartition(".")[0]
    return None


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The dpsql modules that the file at ``path`` imports, anywhere (see the docstring)."""
    name = "dpsql" if path.name == "__init__.py" else f"dpsql.{path.stem}"
    package = "dpsql"
    found: set[str] = set()
    for stmt in _statements(ast.parse(path.read_text(), str(path))):
        for node in ast.walk(stmt):
            if isinstance(node, ast.Import):
                found.update(t for a in node.names if (t := _target(a.name, modules)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                for alias in node.names:
                    # `from dpsql import accounting` imports the submodule, `from dpsql import
                    # connect` the package
                    target = _target(f"{base}.{alias.name}", modules) or _target(base, modules)
                    if target:
                        found.add(target)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    """dpsql module -> the dpsql modules it imports."""
    files = {
        ("dpsql" if p.name == "__init__.py" else f"dpsql.{p.stem}"): p for p in PACKAGE.glob("*.py")
    }
    # compiled modules (dpsql._core) import nothing of dpsql's
    compiled = {f"dpsql.{p.name.split('.')[0]}" for p in PACKAGE.glob("*.pyi")}
    modules = set(files) | compiled
    return {name: imports_of(path, modules) for name, path in files.items()}


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    """The modules that importing ``start`` imports, directly or not (``start`` itself only
    through a circle)."""
    seen: set[str] = set()
    todo = list(edges.get(start, ()))
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo.extend(edges.get(v, ()))
    return seen


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The modules of each import circle (modules that each import the others, directly or
    not), sorted."""
    reach = {v: _reachable(edges, v) for v in edges}
    found: list[list[str]] = []
    for v in sorted(edges):
        if v in reach[v] and not any(v in c for c in found):
            found.append(sorted(w for w in reach[v] if v in reach.get(w, ())))
    return found


def one_cycle(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the circle's first module back to it, inside the circle."""
    start, inside = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & inside):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError("a strongly connected component without a cycle")  # pragma: no cover


def test_the_cycle_finder_finds_a_lazy_import_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f():\n    from dpsql import b\n")
    (tmp_path / "b.py").write_text("from dpsql.c import x\n")
    (tmp_path / "c.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    from dpsql import a\n"
        "if __name__ == '__main__':\n    import dpsql.a\n"
    )
    modules = {"dpsql.a", "dpsql.b", "dpsql.c"}
    edges = {f"dpsql.{m}": imports_of(tmp_path / f"{m}.py", modules) for m in "abc"}
    assert edges == {"dpsql.a": {"dpsql.b"}, "dpsql.b": {"dpsql.c"}, "dpsql.c": set()}
    assert circles(edges) == []
    (tmp_path / "c.py").write_text("def g():\n    import dpsql.a as a\n")
    edges["dpsql.c"] = imports_of(tmp_path / "c.py", modules)
    assert circles(edges) == [["dpsql.a", "dpsql.b", "dpsql.c"]]
    assert one_cycle(["dpsql.a", "dpsql.b", "dpsql.c"], edges) == [
        "dpsql.a",
        "dpsql.b",
        "dpsql.c",
        "dpsql.a",
    ]


def test_no_dpsql_module_imports_itself_through_others() -> None:
    edges = graph()
    assert "dpsql.accounting" in edges and edges["dpsql.ledger_events"]  # the files were read
    found = circles(edges)
    assert not found, "import circles among dpsql modules:\n" + "\n".join(
        f"{', '.join(c)} (e.g. {' -> '.join(one_cycle(c, edges))})" for c in found
    )
