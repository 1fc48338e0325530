"""Where published revisions and release records live, behind a URL (``file:///path``,
``s3://bucket/prefix``): the record store and revision store interfaces and the ``Store`` that is
both, one implementation per kind (a POSIX tree; the ``s3`` package), the registry that opens a
URL, and what is done to a store as such (bootstrap, the conditional-write probe, FSx preload,
re-verification). A store answers for itself: what a URL's scheme or a store's class decides is
decided in this package, never outside it. It knows nothing of tuples, channels or policy.
"""
