from setuptools import setup

setup(cffi_modules=["shm/_build.py:ffibuilder"])
