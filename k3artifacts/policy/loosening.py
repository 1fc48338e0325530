"""What a proposed policy relaxes against the one in force, in words, failing closed: every
difference between the two documents counts as loosening unless a rule here proves it
stricter for that very field. A change whose every difference is proven stricter needs one
root identity; any other change needs the root's threshold (:mod:`.record`).

Proven stricter, field by field (anything else that differs loosens, whatever the field: a
traffic step or window, a Prometheus URL, a region, a suite's text, a key's description):

* a channel's ``gates``: the old ones kept, in order, others added; ``targets``: a superset;
  ``rollback_approval``: turned on; ``rollback_window``: larger;
* ``evaluation``: added; ``min_pass_rate`` higher; ``latency`` added, its ``max_e2e_p99_s``
  lower; ``max_regression`` added or lower; ``allow_unsandboxed_code`` turned off;
  ``latency_regression``: a higher ``alpha``, a lower ``margin`` and ``floor_ms``,
  ``inconclusive`` made ``fail`` (``min_samples`` and ``max_samples`` have no direction that is
  stricter whatever the rest says: any change to them loosens);
* ``order``: added; ``min_hours`` longer; ``passed`` a superset; ``duties``: added,
  ``not_reviewer_of`` a superset;
* ``traffic.thresholds``: a higher quantile, lower ``max_e2e_s``, ``max_ttft_s`` and
  ``max_error_rate``, more ``min_requests``; ``traffic.against_stable``: added, and its fields
  as ``latency_regression``'s;
* ``infrastructure``: added; ``max_age_hours`` and ``max_load_seconds`` lower; ``warmup_hours``,
  ``soak_hours`` and ``production_hours`` longer;
* ``evidence``: added; ``signers``: no kind's number lower (absent: 1); ``apart``: every two
  kinds kept apart before still apart (a kind added to a group, a group split or added);
* ``warm_start`` (absent: enabled, no signature asked): disabled, or ``require_signature``
  turned on;
* ``retention``: ``keep``, ``keep_days``, ``rollback_window`` larger; ``freshness``: added,
  ``lifetime_hours`` shorter;
  ``identity.claimed_actor_on_file_stores`` and ``unsigned.read_before_migration`` turned off;
* identities (``identities.yaml``): an identity, a key or a role removed
  (:func:`k3artifacts.trust.identities.loosening` names what is added: a release identity, or
  the ``release`` role, loosens as trusting a release key did); a channel's
  ``release_channels`` rule added, made ``required``, ``verify_bytes``, or counting fewer
  release identities (none listed: every one holding the role).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from k3artifacts.policy.document import IDENTITIES_FILE, PolicyDocument
from k3artifacts.policy.model import GATES_FILE
from k3artifacts.trust.identities import loosening as identities_loosening

#: A verdict on two different values of one field: True stricter, False not, None: compare
#: their fields one by one (both are sections).
Rule = Callable[[Any, Any], bool | None]
Path = tuple[str, ...]


def _higher(old: Any, new: Any) -> bool:
    return old is not None and new is not None and new >= old


def _lower(old: Any, new: Any) -> bool:
    return old is not None and new is not None and new <= old


def _more(old: Any, new: Any) -> bool:
    return set(old or ()) <= set(new or ())


def _turned_on(old: Any, new: Any) -> bool:
    return bool(new)


def _turned_off(old: Any, new: Any) -> bool:
    return not new


def _added(old: Any, new: Any) -> bool | None:
    """A section that only adds requirements: added is stricter, removed is not, and two of
    them are compared field by field."""
    if old is None:
        return True
    return None if new is not None else False


def _kept_in_order(old: list[str], new: list[str]) -> bool:
    rest = iter(new)
    return all(gate in rest for gate in old)


def _capped(old: Any, new: Any) -> bool:
    return new is not None and (old is None or new <= old)


def _no_fewer_signers(old: Any, new: Any) -> bool:
    return all((new or {}).get(kind, 1) >= n for kind, n in (old or {}).items())


def _apart_pairs(groups: Any) -> set[frozenset[str]]:
    return {frozenset((a, b)) for i, group in enumerate(groups or ())
            for other in (groups or ())[i + 1:] for a in group for b in other}


def _still_apart(old: Any, new: Any) -> bool:
    return _apart_pairs(old) <= _apart_pairs(new)


def _made_fail(old: Any, new: Any) -> bool:
    return new == "fail"


_CHANNEL: dict[Path, Rule] = {
    ("gates",): _kept_in_order,
    ("targets",): _more,
    ("rollback_approval",): _turned_on,
    ("rollback_window",): _higher,
    ("evaluation",): _added,
    ("evaluation", "min_pass_rate"): _higher,
    ("evaluation", "latency"): _added,
    ("evaluation", "latency", "max_e2e_p99_s"): _lower,
    ("evaluation", "max_regression"): _capped,
    ("evaluation", "allow_unsandboxed_code"): _turned_off,
    ("evaluation", "latency_regression", "alpha"): _higher,
    ("evaluation", "latency_regression", "margin"): _lower,
    ("evaluation", "latency_regression", "floor_ms"): _lower,
    ("evaluation", "latency_regression", "inconclusive"): _made_fail,
    ("traffic", "against_stable"): _added,
    ("traffic", "against_stable", "alpha"): _higher,
    ("traffic", "against_stable", "margin"): _lower,
    ("traffic", "against_stable", "floor_ms"): _lower,
    ("traffic", "against_stable", "inconclusive"): _made_fail,
    ("order",): _added,
    ("order", "min_hours"): _higher,
    ("order", "passed"): _more,
    ("duties",): _added,
    ("duties", "not_reviewer_of"): _more,
    ("traffic", "thresholds", "quantile"): _higher,
    ("traffic", "thresholds", "max_e2e_s"): _lower,
    ("traffic", "thresholds", "max_ttft_s"): _lower,
    ("traffic", "thresholds", "max_error_rate"): _lower,
    ("traffic", "thresholds", "min_requests"): _higher,
    ("infrastructure",): _added,
    ("infrastructure", "max_age_hours"): _lower,
    ("infrastructure", "max_load_seconds"): _lower,
    ("infrastructure", "warmup_hours"): _higher,
    ("infrastructure", "soak_hours"): _higher,
    ("infrastructure", "production_hours"): _higher,
    ("evidence",): _added,
    ("evidence", "signers"): _no_fewer_signers,
    ("evidence", "apart"): _still_apart,
    ("warm_start", "enabled"): _turned_off,
    ("warm_start", "require_signature"): _turned_on,
}

def _bounded(old: Any, new: Any) -> bool | None:
    """A bound added where there was none is stricter; two bounds are compared field by
    field; a bound removed loosens."""
    if old is None:
        return True
    return None if new is not None else False


_GATES: dict[Path, Rule] = {
    ("freshness",): _bounded,
    ("freshness", "lifetime_hours"): _lower,
    ("retention", "keep"): _higher,
    ("retention", "keep_days"): _higher,
    ("retention", "rollback_window"): _higher,
    ("identity", "claimed_actor_on_file_stores"): _turned_off,
    ("unsigned", "read_before_migration"): _turned_off,
}

def _shown(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    text = text.removesuffix("...").strip()
    return text if len(text) <= 60 else text[:57] + "..."


def _diff(path: Path, old: Any, new: Any, rules: dict[Path, Rule], where: str,
          found: list[str]) -> None:
    """Every difference between ``old`` and ``new`` under ``path`` not proven stricter."""
    if old == new:
        return
    rule = rules.get(path)
    verdict = None if rule is None else rule(old, new)
    if verdict is True:
        return
    if verdict is None and isinstance(old, dict) and isinstance(new, dict):
        for name in sorted(set(old) | set(new)):
            _diff((*path, name), old.get(name), new.get(name), rules, where, found)
        return
    field = ".".join(path)
    found.append(f"changes {where}{field} ({_shown(old)} -> {_shown(new)})")


def _gate_policy(old: PolicyDocument, new: PolicyDocument) -> list[str]:
    found: list[str] = []
    before, after = old.gates.model_dump(mode="json"), new.gates.model_dump(mode="json")
    for name, chan in before["channels"].items():
        if name not in after["channels"]:
            found.append(f"removes channel {name}")
            continue
        later = after["channels"][name]
        removed = [g for g in chan["gates"] if g not in later["gates"]]
        if removed:
            found.append(f"removes gate(s) {', '.join(removed)} from {name}")
        elif not _kept_in_order(chan["gates"], later["gates"]):
            found.append(f"reorders the gates of {name}")
        for section in (chan, later):  # absent: enabled, no signature asked for
            section["warm_start"] = section["warm_start"] or {"enabled": True,
                                                              "require_signature": False}
        rest = {k: v for k, v in chan.items() if k != "gates"}
        _diff((), rest, {k: v for k, v in later.items() if k != "gates"}, _CHANNEL,
              f"channel {name}: ", found)
    found += [f"adds channel {name}" for name in after["channels"]
              if name not in before["channels"]]
    _diff((), {k: v for k, v in before.items() if k != "channels"},
          {k: v for k, v in after.items() if k != "channels"}, _GATES, "", found)
    return found


def _identities(old: PolicyDocument, new: PolicyDocument) -> list[str]:
    before, after = old.identities, new.identities
    found = identities_loosening(before, after)
    for name, ident in after.identities.items():
        earlier = before.identities.get(name)
        if earlier is None:
            continue
        keys = {k.id: k.model_dump() for k in earlier.keys}
        if ident.about != earlier.about or any(
                k.id in keys and k.model_dump() != keys[k.id] for k in ident.keys):
            found.append(f"changes how identity {name} is described")
    return found


def _other_files(old: PolicyDocument, new: PolicyDocument) -> list[str]:
    """Every other file (evaluation suites; an old policy's ``signing/`` files, which only
    their migration reads) that differs: none has a rule."""
    judged = {GATES_FILE, IDENTITIES_FILE}
    return [f"changes {rel}" for rel in sorted(set(old.files) | set(new.files))
            if rel not in judged and old.files.get(rel) != new.files.get(rel)]


def loosening(old: PolicyDocument, new: PolicyDocument) -> list[str]:
    """What ``new`` relaxes against ``old``, in words; empty when every difference is proven
    stricter (or there is none)."""
    return [*_gate_policy(old, new), *_identities(old, new), *_other_files(old, new)]
