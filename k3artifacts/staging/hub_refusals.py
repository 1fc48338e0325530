"""What a Hub's 401 or 403 means, read as ``huggingface_hub`` reads it (``hf_raise_for_status``):
the answer of a host that is up and refused this process's credentials, never an outage.

huggingface.co answers a wrong, expired or revoked token with 401 and ``X-Error-Message:
Invalid credentials in Authorization header`` (on any repo, public ones too); a gated repo's
file with ``X-Error-Code: GatedRepo``, 401 to an anonymous request and 403 to a token whose
account has not been granted access (its terms not accepted, or not yet approved); a
fine-grained token without read access to the repo with 403. A 401 without either header is
the answer for a private repo, or one that does not exist: not found, decided by the caller.
"""

from __future__ import annotations

from k3artifacts.errors import CredentialsRefused

INVALID_CREDENTIALS = "invalid credentials"
TOKEN_HINT = ("HF_TOKEN (else the token `hf auth login` saved) is wrong, expired or revoked: set "
              "HF_TOKEN to a valid read token (https://huggingface.co/settings/tokens), or unset "
              "it for a public repo; `hf auth whoami` says whose a token is")


def credentials_refused(what: str, status: int, headers: dict[str, str], page: str
                        ) -> CredentialsRefused | None:
    """The named refusal for a Hub answer of ``status`` (headers lower-cased) to a request
    about the repo whose page is ``page``, or None when the answer is no credential error."""
    code = headers.get("x-error-code", "")
    message = headers.get("x-error-message", "")[:300]
    said = f" ({message})" if message else ""
    if status == 401 and INVALID_CREDENTIALS in message.lower():
        return CredentialsRefused(f"{what}: the hub refused the token: HTTP 401{said}",
                                  hint=TOKEN_HINT)
    if code == "GatedRepo" and status == 401:
        return CredentialsRefused(
            f"{what}: gated repository, and no token was sent: HTTP 401{said}",
            hint=f"accept the model's terms on its page ({page}) while logged in, then set "
                 "HF_TOKEN to a read token of that account and re-run")
    if code == "GatedRepo" or status == 403:
        gated = "gated repository: " if code == "GatedRepo" else ""
        return CredentialsRefused(
            f"{what}: {gated}the token's account has no access: HTTP 403{said}",
            hint=f"accept the model's terms on its page ({page}) with the account HF_TOKEN "
                 "belongs to (`hf auth whoami`), wait for access to be granted, then re-run; a "
                 "fine-grained token also needs read access to this repo")
    return None
