"""Credentials in URLs, removed before a URL is printed, logged or stored.

A URL may carry a password (``http://user:PASS@host``) or a signature in its query
(``X-Amz-Signature``, ``sig``, ``token``...): presigned CDN links, a registry's token realm, an
endpoint typed with its key. The password and the values of such parameters become ``***``;
everything else is kept as written, so the URL still says which peer was meant.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

HIDDEN = "***"
#: Query parameters whose value is a credential, lower case: AWS SigV4 presigned URLs, Azure
#: SAS (``sig``), GCS signed URLs, and the usual token and key names.
SECRET_PARAMS = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "signature", "sig",
    "x-goog-signature", "x-goog-credential", "token", "access_token", "id_token",
    "refresh_token", "api_key", "apikey", "key", "password", "passwd", "secret",
    "client_secret", "auth", "authorization", "credential", "policy", "key-pair-id",
})
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{}]+")


def _secret(name: str) -> bool:
    lowered = name.lower()
    return lowered in SECRET_PARAMS or any(
        word in lowered for word in ("signature", "secret", "password", "token"))


def redact_url(url: str) -> str:
    """``url`` without the password of its userinfo and the values of credential parameters."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _redact_userinfo(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{HIDDEN}@{hostport}" if colon else netloc
    query = "&".join(_redact_param(p) for p in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> frozenset[str]:
    """The credentials ``url`` carries, as written and decoded: its userinfo's password and
    the values of its credential parameters. A peer may quote them outside any URL (a server
    echoing the Basic credential the client derived from the userinfo)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return frozenset()
    found = set()
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    if ":" in userinfo:
        found.add(userinfo.partition(":")[2])
    for param in parts.query.split("&") if parts.query else ():
        name, eq, value = param.partition("=")
        if eq and value and _secret(name):
            found.add(value)
    return frozenset(v for raw in found for v in (raw, unquote(raw)) if v)


def _redact_param(param: str) -> str:
    name, eq, value = param.partition("=")
    return f"{name}={HIDDEN}" if eq and value and _secret(name) else param


def _redact_userinfo(text: str) -> str:
    return re.sub(r"(//[^/@:\s]*):[^/@\s]*@", rf"\1:{HIDDEN}@", text)


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (:func:`redact_url`): error messages, hints."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: redact_url(m.group(0)), text)
