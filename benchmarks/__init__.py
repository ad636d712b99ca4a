"""Blueque's benchmark: ``python -m benchmarks.run`` (see benchmarks/run.py and
docs/performance.md)."""
