"""IAM policy evaluation for one principal's identity policies: is ``action`` on ``resource``
allowed? AWS's order: an explicit Deny wins, else any Allow, else the implicit deny.

Covers what inference roles use: ``Action``/``NotAction``, ``Resource``/``NotResource``, ``*`` and
``?`` wildcards (actions case-insensitive). A statement with a ``Condition`` is taken to apply
(for an Allow this over-grants, so "cannot read that" is never concluded from a condition;
for a Deny it is ignored, so "is denied" never rests on one). Permission boundaries, SCPs and
bucket policies are not evaluated: the role's own policies must already be narrow.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any


def _list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _matches(patterns: list[str], value: str, *, fold: bool) -> bool:
    if fold:
        value = value.lower()
    return any(fnmatchcase(value, p.lower() if fold else p) for p in patterns)


def _applies(statement: dict[str, Any], action: str, resource: str) -> bool:
    if "Action" in statement:
        hit = _matches(_list(statement["Action"]), action, fold=True)
    else:
        hit = not _matches(_list(statement.get("NotAction")), action, fold=True)
    if not hit:
        return False
    if "Resource" in statement:
        return _matches(_list(statement["Resource"]), resource, fold=False)
    return not _matches(_list(statement.get("NotResource")), resource, fold=False)


def statements(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for doc in documents:
        body = doc.get("Statement", [])
        found += [body] if isinstance(body, dict) else list(body)
    return found


def allowed(documents: list[dict[str, Any]], action: str, resource: str) -> bool:
    verdict = False
    for st in statements(documents):
        if not _applies(st, action, resource):
            continue
        if st.get("Effect") == "Deny" and "Condition" not in st:
            return False
        if st.get("Effect") == "Allow":
            verdict = True
    return verdict
