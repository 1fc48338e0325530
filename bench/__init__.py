"""Benchmarks for k3artifacts (issue 6): ``python -m bench --help``.

Not part of the library and not run by pytest: the figures are timings, and timings belong
here, measured as ratios inside one run, never in tests.
"""
