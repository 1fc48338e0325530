"""What a proposed policy relaxes against the one in force, in words: a change that loosens any
channel needs the approval of a second identity before ``k3a policy apply`` (:mod:`.change`)."""

from __future__ import annotations

import yaml

from k3artifacts.policy.document import SIGNING_FILE, PolicyDocument


def _signing(document: PolicyDocument) -> dict:  # type: ignore[type-arg]
    text = document.files.get(SIGNING_FILE)
    return (yaml.safe_load(text) or {}) if text else {}


def loosening(old: PolicyDocument, new: PolicyDocument) -> list[str]:
    """What ``new`` relaxes against ``old``, in words; empty when it only tightens or keeps."""
    found = []
    before, after = old.gates, new.gates
    if after.identity.claimed_actor_on_file_stores and not (
            before.identity.claimed_actor_on_file_stores):
        found.append("lets typed names stand for who acts on file stores")
    for name, chan in before.channels.items():
        if name not in after.channels:
            found.append(f"removes channel {name}")
            continue
        new_chan = after.channels[name]
        removed = [g for g in chan.gates if g not in new_chan.gates]
        if removed:
            found.append(f"removes gate(s) {', '.join(removed)} from {name}")
        for setting in ("evaluation", "targets", "order", "duties"):
            if getattr(chan, setting) != getattr(new_chan, setting):
                found.append(f"changes the {setting} settings of {name}")
        if chan.rollback_approval and not new_chan.rollback_approval:
            found.append(f"lets {name} roll back without approval")
        suite = chan.evaluation and chan.evaluation.suite_file
        if suite and old.files.get(suite) != new.files.get(suite):
            found.append(f"changes the evaluation suite {suite} of {name}")
    old_sign, new_sign = _signing(old).get("channels") or {}, _signing(new).get("channels") or {}
    for name, rule in old_sign.items():
        if new_sign.get(name) != rule:
            found.append(f"changes the signing requirement of {name}")
    old_keys, new_keys = _signing(old).get("keys") or {}, _signing(new).get("keys") or {}
    for name in sorted(set(new_keys) - set(old_keys)):
        found.append(f"trusts a new signing key {name}")
    for name in sorted(set(old_keys) & set(new_keys)):
        if old.files.get(f"signing/{old_keys[name]}") != new.files.get(f"signing/{new_keys[name]}"):
            found.append(f"replaces signing key {name}")
    return found
