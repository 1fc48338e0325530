"""What a readiness report may keep of what an endpoint, or a model's code, said.

An answer is hostile input that ends up printed and stored for good in the evaluation record: a
model (or the code it wrote) that got hold of one of this process's secrets would publish it
there, and an error may quote the endpoint's URL with its password (a client's connection
error, a proxy's error page echoing the request). So every text from outside is cut to
:data:`MAX_BYTES`, every value of this process's secrets
(:func:`k3artifacts.settings.secret_values`) and of the run's own (the endpoint URL's
credential, the API key) is replaced by :data:`REDACTED`, and every URL left in it loses its
credentials (:func:`k3artifacts.net.redact.redact_text`) before anything prints or records it.
"""

from __future__ import annotations

from collections.abc import Iterable

from k3artifacts import settings
from k3artifacts.net.redact import redact_text, url_secrets

#: At most this many bytes (UTF-8) of one text: a detail, a model name, an error.
MAX_BYTES = 1024
REDACTED = "[redacted]"


def clip_bytes(text: str, limit: int = MAX_BYTES) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + f"... ({len(data) - limit:,} bytes cut)"


class Redactor:
    """Cuts secret values out of a text, then bounds it."""

    def __init__(self, secrets: Iterable[str]):
        # Longest first: a secret that contains another is cut whole.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    @classmethod
    def of_process(cls, *, endpoint: str | None = None,
                   api_key: str | None = None) -> Redactor:
        """This process's secrets, and the ones a run was handed: ``endpoint``'s credential
        and ``api_key`` (an option, which no variable name marks as secret)."""
        handed = set(url_secrets(endpoint) if endpoint else ()) | {api_key or ""}
        return cls(settings.secret_values()
                   | {s for s in handed if len(s) >= settings.MIN_SECRET_LENGTH})

    def scrub(self, text: str) -> str:
        """``text`` without the secrets, whole (an answer before it is judged: anything cut
        from it later can no longer hold a piece of one)."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def __call__(self, text: str) -> str:
        """``text`` as it may be printed or stored: scrubbed, its URLs without credentials,
        bounded."""
        return clip_bytes(redact_text(self.scrub(text)))
