"""The one network layer: every HTTP request k3a's own clients make goes through here.

- :mod:`.policy`: how hard to try (attempts, backoff, what a server may ask us to wait) and
  how long to wait (connect, read, a total deadline), one :class:`~.policy.RetryPolicy` read
  from the settings (``K3A_HTTP_*``);
- :mod:`.deadline`: the total deadline over an answer's headers (and a small answer's body),
  enforced on every socket read, for urllib3 and for the ``openai`` client's httpx;
- :mod:`.pool`: the urllib3 pool factory (TLS, the CA bundle from the settings);
- :mod:`.attempt`: one request (no retry), redirects with the credential kept on its origin,
  which hosts ever answered, what failed and whether a retry may fix it;
- :mod:`.calls`: a small call with the whole retry policy (the Hub API, a registry,
  Prometheus, the Kubernetes API, a ``/metrics`` page);
- :mod:`.transfer`: the bookkeeping of a long transfer across attempts (new bytes, rate floor);
- :mod:`.redact`: credentials in URLs, removed from anything printed, logged or stored;
- :mod:`.endpoint`: the httpx client the ``openai`` package is given.

S3 goes through boto3/botocore, with its own retries and timeouts (``stores/awsclients.py``).
"""
