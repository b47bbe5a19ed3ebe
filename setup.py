"""Build the Cython bindings of the C core (dpsql._core).

The same C files in cython_ext/core are compiled into the PostgreSQL extension by sql/Makefile;
both builds use -ffp-contract=off so that the in-database and in-memory engines give the same bits.
"""

from glob import glob

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

core_sources = sorted(glob("cython_ext/core/*.c"))

ext = Extension(
    "dpsql._core",
    sources=["cython_ext/_core.pyx", *core_sources],
    include_dirs=["cython_ext/core", numpy.get_include()],
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

setup(ext_modules=cythonize([ext], language_level=3, compiler_directives={"boundscheck": False}))
