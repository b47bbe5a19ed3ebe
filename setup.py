"""Build the Cython bindings of the C core (dpsql._core), and ship the extension's sources.

The C core (core/, pure C99) is compiled here with the bindings in cython_ext/ and into the
PostgreSQL extension by sql/Makefile; both builds use -ffp-contract=off so that the in-database and
in-memory engines give the same bits. A built package (wheel) carries sql/ and core/ under
dpsql/_ext, side by side as in the checkout, so that `dpsql install-extension --pg-config ...`
works without a source checkout.
"""

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from glob import glob
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

core_sources = sorted(glob("core/*.c"))

ext = Extension(
    "dpsql._core",
    sources=["cython_ext/_core.pyx", *core_sources],
    include_dirs=["core", numpy.get_include()],
    # -g0: no debug information (it doubled the compile time of the Cython module)
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-g0"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)


def _not_sources(folder: str, names: list[str]) -> set[str]:
    """Build products (and sql/'s assembled scripts, which make rebuilds) stay out."""
    skip = {n for n in names if n.endswith((".o", ".so", ".bc")) or n in ("build", "results")}
    if Path(folder).name == "sql":
        skip |= {n for n in names if n.startswith(("dpsql--", "regression.", ".pg_build_id"))}
    return skip


# The module Cython generates from cython_ext/_core.pyx (60,000 lines of glue, no arithmetic
# on floats: the C core does it) compiles at -O1, in half the time -O3 takes. Without
# -ffast-math and with -ffp-contract=off the optimisation level changes no floating-point result.
GLUE_FLAGS = ["-O1"]


class ParallelBuildExt(build_ext):
    """Compiles the extension's sources side by side, one compiler per core (setuptools runs
    them one after another), the Cython module first: it takes the longest."""

    def build_extension(self, ext: Extension) -> None:
        compiler = self.compiler
        serial = compiler.compile

        def compile_parallel(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                             extra_preargs=None, extra_postargs=None, depends=None):  # fmt: skip
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs
            )
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

            def one(obj: str) -> None:
                src, ext_name = build[obj]
                glue = src.startswith("cython_ext" + os.sep)
                post = [*extra_postargs, *GLUE_FLAGS] if glue else extra_postargs
                compiler._compile(obj, src, ext_name, cc_args, post, pp_opts)

            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                list(pool.map(one, [obj for obj in objects if obj in build]))
            return objects

        compiler.compile = compile_parallel
        try:
            super().build_extension(ext)
        finally:
            compiler.compile = serial


class BuildPyWithExtension(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "dpsql" / "_ext"
        for folder in ("sql", "core"):
            if Path(folder).is_dir():
                shutil.rmtree(target / folder, ignore_errors=True)
                shutil.copytree(folder, target / folder, ignore=_not_sources)


setup(
    ext_modules=cythonize([ext], language_level=3, compiler_directives={"boundscheck": False}),
    cmdclass={"build_py": BuildPyWithExtension, "build_ext": ParallelBuildExt},
)
