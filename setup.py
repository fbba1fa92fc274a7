# Metadata lives in setup.cfg; this file exists for the native helper's
# cffi build step, which setuptools only accepts here.
from setuptools import setup

setup(cffi_modules=["edgebroker/_native/_build.py:ffibuilder"])
