"""What a readiness report may keep of what an endpoint, or a model's code, said.

An answer is hostile input that ends up printed and stored for good in the evaluation record: a
model (or the code it wrote) that got hold of one of this process's secrets would publish it
there. So every text from outside is cut to :data:`MAX_BYTES` and every value of this
process's secrets (:func:`k3artifacts.settings.secret_values`) is replaced by
:data:`REDACTED` before anything prints or records it.
"""

from __future__ import annotations

from collections.abc import Iterable

from k3artifacts import settings

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
    def of_process(cls) -> Redactor:
        return cls(settings.secret_values())

    def scrub(self, text: str) -> str:
        """``text`` without the secrets, whole (an answer before it is judged: anything cut
        from it later can no longer hold a piece of one)."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def __call__(self, text: str) -> str:
        return clip_bytes(self.scrub(text))
