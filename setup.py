"""Build hook: cffi compiles the C reduction kernels at install time (API mode, out of line)."""

from setuptools import setup

setup(cffi_modules=["csrc/build_kernels.py:ffibuilder"])
