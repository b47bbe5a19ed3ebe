"""Build the Cython bindings of the C core (dpsql._core), and ship the extension's sources.

The C core (core/, pure C99) is compiled here with the bindings in cython_ext/ and into the
PostgreSQL extension by sql/Makefile; both builds use -ffp-contract=off so that the in-database and
in-memory engines give the same bits. A built package (wheel) carries sql/ and core/ under
dpsql/_ext, side by side as in the checkout, so that `dpsql install-extension --pg-config ...`
works without a source checkout.
"""

import shutil
from glob import glob
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

core_sources = sorted(glob("core/*.c"))

ext = Extension(
    "dpsql._core",
    sources=["cython_ext/_core.pyx", *core_sources],
    include_dirs=["core", numpy.get_include()],
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)


def _not_sources(folder: str, names: list[str]) -> set[str]:
    """Build products (and sql/'s assembled scripts, which make rebuilds) stay out."""
    skip = {n for n in names if n.endswith((".o", ".so", ".bc")) or n in ("build", "results")}
    if Path(folder).name == "sql":
        skip |= {n for n in names if n.startswith(("dpsql--", "regression.", ".pg_build_id"))}
    return skip


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
    cmdclass={"build_py": BuildPyWithExtension},
)
