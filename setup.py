"""Build step for the one C extension, ``mirror_core._native`` (the metadata is in pyproject.toml).

The extension is optional: without a C compiler the install still succeeds and the writer keeps its
Python produce loop (``mirror_core.native.available()`` says which one runs)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mirror_core._native", ["mirror_core/_native.c"], libraries=["dl"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Werror"])])
