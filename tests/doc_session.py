"""Runs a docs page's code blocks as written, in order, as a reader would
(tests/server/test_quickstarts.py).

- ``sh`` blocks run in bash from the checkout, one after another, with the variables that
  earlier blocks set (``OLIVIA=$(dpsql role create ...)``) carried over. A block followed by
  a plain block that starts with ``dpsql:`` is a refusal the page shows: it must fail, and
  print exactly that. A line ``NAME="..."  # yours...`` is a value the reader fills in (the
  URI they were given): the session sets it from ``yours[NAME]``, a variable of earlier blocks.
- ``sql`` blocks run through one psql session per login (so ``\\gset`` variables live on), with
  ``ON_ERROR_STOP``: any error fails the block.
- ``python`` blocks run in a new interpreter, with the shell's variables in its environment.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_YOURS = re.compile(r'^(\w+)="[^"]*"(\s+# yours\b.*)$', re.MULTILINE)


@dataclass
class Block:
    language: str  # sh, sql, python, or "" (output the page shows)
    text: str
    section: str  # the "## " heading above it


def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, in order, each with its section."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        headings = re.findall(r"^## .*$", text[: match.start()], re.MULTILINE)
        found.append(Block(match.group(1), match.group(2), headings[-1] if headings else ""))
    return found


class Session:
    """One reader's shell state, psql sessions and interpreter runs over a checkout."""

    def __init__(self, cwd: Path, env: dict[str, str], psql: Path, yours: dict[str, str]):
        self.cwd, self.env, self.psql, self.yours = cwd, env, psql, yours
        self._dir = Path(tempfile.mkdtemp(prefix="dpsql-docs-"))
        self._state = self._dir / "state.sh"
        self._state.write_text("")
        self._psql: dict[str, subprocess.Popen[str]] = {}

    def run(self, page: list[Block], sql_as: str) -> None:
        """Every block of ``page``; its SQL blocks as the login in shell variable ``sql_as``."""
        for i, block in enumerate(page):
            if block.language == "sh":
                following = page[i + 1] if i + 1 < len(page) else None
                refusal = following.text if following and not following.language else None
                self.shell(
                    block.text, refusal if refusal and refusal.startswith("dpsql:") else None
                )
            elif block.language == "sql":
                self.sql(self.var(sql_as), block.text)
            elif block.language == "python":
                self.python(block.text)

    def shell(self, text: str, refusal: str | None = None) -> str:
        """Run a sh block; ``refusal``: it must fail and print exactly this on stderr."""
        text = _YOURS.sub(lambda m: f'{m.group(1)}="${{{self.yours[m.group(1)]}}}"', text)
        state = shlex.quote(str(self._state))
        # (allexport: what a block sets reaches the next block and the python ones)
        script = f"set -ae; . {state}\n{text}\nexport -p > {state}\n"
        done = subprocess.run(
            ["bash", "-c", script], cwd=self.cwd, env=self.env, capture_output=True, text=True,
            timeout=900, check=False,
        )  # fmt: skip
        if refusal is not None:
            assert done.returncode != 0, f"expected the refusal the page shows:\n{text}"
            assert done.stderr.strip() == refusal.strip(), (done.stderr, refusal)
            return done.stdout
        assert done.returncode == 0, (
            f"{text}\nexit {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        return done.stdout

    def var(self, name: str) -> str:
        """A variable the shell blocks set."""
        out = subprocess.run(
            ["bash", "-c", f'. {shlex.quote(str(self._state))}; printf %s "${name}"'],
            env=self.env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert out.stdout, f"no shell variable {name}"
        return out.stdout

    def sql(self, uri: str, text: str) -> str:
        """Run a sql block in ``uri``'s psql session; returns what psql printed."""
        if uri not in self._psql:
            self._psql[uri] = subprocess.Popen(
                [str(self.psql), uri, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-P", "pager=off"],
                cwd=self.cwd, env=self.env, text=True, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
        psql = self._psql[uri]
        assert psql.stdin is not None and psql.stdout is not None
        marker = f"-- done {uuid.uuid4().hex}"
        psql.stdin.write(f"{text}\n\\echo '{marker}'\n")
        psql.stdin.flush()
        lines: list[str] = []
        for line in psql.stdout:
            if line.rstrip("\n") == marker:
                return "".join(lines)
            lines.append(line)
        raise AssertionError(f"psql stopped on:\n{text}\n{''.join(lines)}")

    def python(self, text: str) -> str:
        env = {**self.env, **self._exported()}
        done = subprocess.run(
            [sys.executable, "-c", text], cwd=self.cwd, env=env, capture_output=True, text=True,
            timeout=900, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{text}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def _exported(self) -> dict[str, str]:
        out = subprocess.run(
            ["bash", "-c", f"set -a; . {shlex.quote(str(self._state))}; env -0"],
            env=self.env, capture_output=True, check=True,
        )  # fmt: skip
        pairs = (item.split(b"=", 1) for item in out.stdout.split(b"\0") if b"=" in item)
        return {k.decode(): v.decode() for k, v in pairs}

    def close(self) -> None:
        for psql in self._psql.values():
            if psql.stdin:
                psql.stdin.close()
            psql.wait(timeout=30)
        for path in self._dir.iterdir():
            path.unlink()
        self._dir.rmdir()
