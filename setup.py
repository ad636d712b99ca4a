"""The thin shim setuptools documents for tools that still call ``setup.py``: every piece of
metadata (name, version, dependencies, extras, package data, the console script) lives in
pyproject.toml, which setuptools reads when ``setup()`` is called without arguments."""

from setuptools import setup

setup()
