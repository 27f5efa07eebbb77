"""Shim so Beam's --setup_file can build and stage this package; metadata lives in pyproject.toml."""

from setuptools import setup

setup()
