"""Prefect 3 flows over the k3artifacts library: staging, watching upstream, promote, rollback.

The library imports no Prefect; everything Prefect-specific (tasks, retries, artifacts,
concurrency limits, pauses for approval, task runners) lives here. Importing this package
changes nothing: each flow quiets its own task logs when it runs (``logs.py``).
"""
