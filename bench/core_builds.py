"""Two builds of the C core's Python module (``dpsql._core``) against each other: speed of the
in-memory SGD epoch, and whether they release the same bits.

setup.py's flags (issue 43: no debug information, the Cython glue at -O1, the C core at -O3
-ffp-contract=off) must change neither the weights nor the in-memory epoch's speed. This loads
each built module from its file, runs one logistic epoch (b = 1) over ``rows x dim`` standard
normal rows, interleaved (A, B, A, B, ...) so that a noisy machine's drift hits both alike, and
compares seeded clipped and noised epochs of three losses bit for bit. Build the other module
with ``python setup.py build_ext --inplace`` in a checkout of another commit.

Usage::

    .venv/bin/python -m bench.core_builds OLD/_core.cpython-311-x86_64-linux-gnu.so \\
        dpsql/_core.cpython-311-x86_64-linux-gnu.so [--rows 1000000] [--dim 50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np


def _load(path: Path, tag: str) -> types.ModuleType:
    """The module at ``path`` as ``<tag>._core`` (its init function is PyInit__core)."""
    sys.modules[tag] = types.ModuleType(tag)
    spec = importlib.util.spec_from_file_location(f"{tag}._core", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _same_bits(modules: list[types.ModuleType]) -> bool:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20_000, 20))
    signs = np.where(rng.random(20_000) < 0.5, 1.0, -1.0)
    runs = []
    for core in modules:
        out = []
        for model in ("logistic", "huber", "linear"):
            state = core.init_state(
                model, 20, eta=0.05, clip_norm=1.0, noise="gaussian", noise_scale=0.3,
                noise_seed=7, batch_size=10, noise_divisor=10.0,
            )  # fmt: skip
            y = X @ np.arange(20) / 10 if model == "linear" else signs
            out.append(np.asarray(core.run_epoch(state, X, y)))
        runs.append(out)
    return all(np.array_equal(a, b) for a, b in zip(*runs, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    modules = [_load(args.a, "build_a"), _load(args.b, "build_b")]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.rows, args.dim)) / 7
    y = np.where(rng.random(args.rows) < 0.5, 1.0, -1.0)
    times: list[list[float]] = [[], []]
    for _ in range(args.repeats):
        for i, core in enumerate(modules):
            state = core.init_state("logistic", args.dim, eta=0.01)
            start = time.perf_counter()
            core.run_epoch(state, X, y)
            times[i].append(time.perf_counter() - start)
    print(f"# core_builds: {args.rows:,} rows x {args.dim}, {args.repeats} repeats, interleaved")
    for name, path, ts in zip("ab", (args.a, args.b), times, strict=True):
        size = path.stat().st_size / 1e6
        print(f"{name}: {path} ({size:.2f} MB): in-memory epoch b=1 median "
              f"{statistics.median(ts) / args.rows * 1e9:.1f} ns/row, "
              f"min {min(ts) / args.rows * 1e9:.1f}")  # fmt: skip
    print(f"b/a median ratio: {statistics.median(times[1]) / statistics.median(times[0]):.3f}")
    print(f"same bits (3 losses, clipped, seeded noise): {_same_bits(modules)}")


if __name__ == "__main__":
    main()
