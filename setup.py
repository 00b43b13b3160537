"""Only the optional Cython extension lives here; everything else is in pyproject.toml.

The extension is optional: without a C compiler (or without Cython) the install still
succeeds and ``service.core`` falls back to the pure-Python reference.
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # pragma: no cover - Cython is in build-system.requires
    ext_modules = []
else:
    ext_modules = cythonize(
        # -g0: no debug information in the module (Python's CFLAGS carry -g): a third of the compile
        # time (15 -> 10 s on a 2-core machine) and a smaller module; the code is the same -O3 build
        [Extension("service.core._sizing", ["service/core/_sizing.pyx"], optional=True, extra_compile_args=["-g0"])],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )

setup(ext_modules=ext_modules)
