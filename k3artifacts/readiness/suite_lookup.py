"""Which suite an evaluation runs: a suite of the policy in force named by its name, the one the
channel's policy names, or a file.

The policy in force is the store's (``k3a policy show``; the packaged defaults while the store
has none): its document carries every ``eval-suites/*.yaml`` of the directory it was made from,
so a name resolves the same way from any working directory and any install, a wheel included.
The run records the suite's sha256 either way; the evaluation gate counts only runs of the
exact bytes its channel's policy names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from k3artifacts.errors import ConfigError, NotFound
from k3artifacts.policy.document import SUITES_DIR
from k3artifacts.policy.record import InForce
from k3artifacts.readiness.suite import Suite, load_suite, parse_suite


@dataclass(frozen=True)
class FoundSuite:
    suite: Suite
    sha256: str
    #: Where it came from, in words: the policy version and the file in it, or the path.
    source: str


def _policy_file(spec: str) -> str:
    """``k3-core``, ``eval-suites/k3-core.yaml`` and ``policies/eval-suites/k3-core.yaml`` (as
    the gate's hint spells it) all name ``eval-suites/k3-core.yaml`` of the policy."""
    path = PurePosixPath(spec)
    if path.parts[:1] == ("policies",):
        path = PurePosixPath(*path.parts[1:])
    if len(path.parts) == 1 and path.suffix not in (".yaml", ".yml"):
        path = PurePosixPath(SUITES_DIR, f"{spec}.yaml")
    elif len(path.parts) == 1:
        path = PurePosixPath(SUITES_DIR, path.name)
    return str(path)


def _from_policy(policy: InForce, rel: str) -> FoundSuite:
    text = policy.document.files[rel]
    where = f"{rel} of policy {policy.label()}"
    suite, sha = parse_suite(text.encode("utf-8"), where)
    return FoundSuite(suite, sha, where)


def channel_suite(policy: InForce, channel: str) -> FoundSuite:
    """The suite ``channel``'s evaluation policy names."""
    rule = policy.document.gates.channels.get(channel)
    suite_file = rule.evaluation.suite_file if rule and rule.evaluation else None
    if suite_file is None:
        raise ConfigError(
            f"channel {channel!r} of policy {policy.label()} names no evaluation suite",
            hint="name one: `--suite NAME` (a suite of the policy) or `--suite FILE`, or the "
                 "channel it is evaluated for: `--channel production`")
    return _from_policy(policy, suite_file)


def find_suite(policy: InForce, spec: str) -> FoundSuite:
    """``spec``: an existing file, else a suite of ``policy`` by name (``k3-core``) or by its
    file in the policy (``eval-suites/k3-core.yaml``)."""
    path = Path(spec)
    if path.is_file():
        suite, sha = load_suite(path)
        return FoundSuite(suite, sha, str(path))
    rel = _policy_file(spec)
    if rel in policy.document.files:
        return _from_policy(policy, rel)
    names = sorted(PurePosixPath(f).stem for f in policy.document.files
                   if f.startswith(f"{SUITES_DIR}/"))
    raise NotFound(
        f"no suite {spec!r}: not a file, and policy {policy.label()} has no {rel}",
        hint=(f"suites of the policy: {', '.join(names)}" if names
              else "the policy holds no suite") + "; or give the path of a suite file")
