"""The policy as one document: the files that judge a promotion, canonical and digested.

A policy directory (the packaged ``policies/``, or one a release engineer edits to propose a
change) holds ``promotion-gates.yaml``, ``identities.yaml`` (who may sign which records and
releases, :mod:`k3artifacts.trust.identities`) and the evaluation suites
(``eval-suites/*.yaml``, which the channels name). The document carries exactly those files'
text, so its sha256 (of canonical JSON) names everything the gates read, and a loose file
beside them can change nothing. The gates that read files (a suite's sha256, the release keys)
read them from the document in memory, and what a gate or an error says about them names the
policy and the file in it ("policy v2 (1f3a...) identities.yaml").

A policy of the time release keys were a model of their own carries
``signing/trusted-keys.yaml`` and its keys: those files are kept as they are, and read only by
their migration (:mod:`k3artifacts.migration.release_keys`, ``k3a trust migrate``); until it
ran, a reader of release signatures is refused by name (:meth:`PolicyDocument.release_keys`).
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_validator

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import ConfigError, MigrationNeeded, plain_validation_errors
from k3artifacts.policy.model import GATES_FILE, GatePolicy, load_gate_policy
from k3artifacts.policy.release_keys import ReleaseKeys
from k3artifacts.trust.identities import Identities

#: Where release keys were trusted before they were identities: read only by its migration.
SIGNING_FILE = "signing/trusted-keys.yaml"
IDENTITIES_FILE = "identities.yaml"
#: Evaluation suites: every ``*.yaml`` here is part of the policy (``k3a eval run --suite
#: NAME`` finds them by name).
SUITES_DIR = "eval-suites"


def _safe(rel: str) -> str:
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ConfigError(f"policy file {rel!r} is outside the policy directory")
    return str(path)


class PolicyDocument(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    #: Relative path -> text, for every file the gates read.
    files: dict[str, str]
    #: How messages name this document (:meth:`shown_as`); not part of what it is.
    _shown: str | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # The files are the document; how it is named where it is in force is not.
        return isinstance(other, PolicyDocument) and self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def shown_as(self, name: str) -> None:
        """Name this document in messages about its files ("policy v2 (1f3a...)")."""
        self._shown = name

    @model_validator(mode="after")
    def _parses(self) -> PolicyDocument:
        for rel in self.files:
            _safe(rel)
        if GATES_FILE not in self.files:
            raise ValueError(f"the policy has no {GATES_FILE}")
        try:
            gates = GatePolicy.model_validate(yaml.safe_load(self.files[GATES_FILE]) or {})
        except (yaml.YAMLError, ValidationError) as exc:
            raise ValueError(f"{GATES_FILE}: {exc}") from None
        for name, chan in gates.channels.items():
            suite = chan.evaluation and chan.evaluation.suite_file
            if suite and suite not in self.files:
                raise ValueError(f"channel {name} names suite {suite}, not in the policy")
        if IDENTITIES_FILE in self.files:
            try:
                Identities.model_validate(yaml.safe_load(self.files[IDENTITIES_FILE]) or {})
            except (yaml.YAMLError, ValidationError) as exc:
                raise ValueError(f"{IDENTITIES_FILE}: {exc}") from None
        return self

    @cached_property
    def gates(self) -> GatePolicy:
        return GatePolicy.model_validate(yaml.safe_load(self.files[GATES_FILE]) or {})

    @cached_property
    def identities(self) -> Identities:
        """Who may sign which records; none where the document has no identities file."""
        text = self.files.get(IDENTITIES_FILE)
        return Identities.model_validate((yaml.safe_load(text) if text else None) or {})

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(canonical_json(self)).hexdigest()

    @classmethod
    def from_dir(cls, policies_dir: Path) -> PolicyDocument:
        """The document of a policy directory: its gate policy, its identities, its
        evaluation suites (``eval-suites/*.yaml``, and any other suite a channel names). Any
        other file there is not policy; a ``signing/trusted-keys.yaml`` is refused (ConfigError,
        exit 9), naming where its keys go now."""
        root = Path(policies_dir)
        gates = load_gate_policy(root)
        wanted = [GATES_FILE]
        if (root / IDENTITIES_FILE).is_file():
            wanted.append(IDENTITIES_FILE)
        suites = {c.evaluation.suite_file for c in gates.channels.values()
                  if c.evaluation and c.evaluation.suite_file}
        suites |= {f"{SUITES_DIR}/{p.name}" for p in (root / SUITES_DIR).glob("*.yaml")
                   if p.is_file()}
        wanted += sorted(suites)
        if (root / SIGNING_FILE).is_file():
            raise ConfigError(
                f"{root / SIGNING_FILE}: release keys are no longer trusted there, but as "
                f"identities holding the release role in {IDENTITIES_FILE}",
                hint=f"move each key into {root / IDENTITIES_FILE} (`k3a key show --entry NAME "
                "--roles release`), its channel rules under release_channels, and remove "
                f"{root / 'signing'}; a store's policy that still has it: `k3a trust migrate` "
                "(docs/guides/signing.md)")
        files = {}
        for rel in wanted:
            try:
                files[_safe(rel)] = (root / rel).read_text(encoding="utf-8")
            except (FileNotFoundError, UnicodeDecodeError) as exc:
                raise ConfigError(f"policy file {root / rel}: {exc}",
                                  hint="the gate policy names it; add it or fix the name") from None
        return cls.parse_files(files, where=str(root))

    def with_file(self, rel: str, text: str) -> PolicyDocument:
        """This document with ``rel`` holding ``text`` (added or replaced)."""
        return self.parse_files({**self.files, _safe(rel): text}, where=self._shown or "policy")

    @classmethod
    def parse_files(cls, files: dict[str, str], *, where: str) -> PolicyDocument:
        try:
            return cls(files=files)
        except ValidationError as exc:
            raise ConfigError(f"policy in {where} is malformed: {plain_validation_errors(exc)}"
                              ) from None

    def write_dir(self, root: Path) -> None:
        """The document's files under ``root`` (a new or empty directory): a policy directory
        to edit and propose, as ``k3a policy show --out`` gives it."""
        for rel, text in self.files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")

    @property
    def label(self) -> str:
        """How messages name this document ("policy v2 (1f3a...)")."""
        return self._shown or f"policy {self.digest[:12]}"

    def release_keys(self) -> ReleaseKeys:
        """Its release identities and channel rules, read from the document itself;
        MigrationNeeded (exit 9) while it still trusts release keys the old way."""
        if SIGNING_FILE in self.files:
            raise MigrationNeeded(
                f"{self.label} still trusts release keys by {SIGNING_FILE}, which only its "
                "migration reads now: no release signature is checked against it",
                hint="a root identity of the store runs `k3a trust migrate`: it proposes the "
                "keys as identities holding the release role (docs/guides/signing.md)")
        return ReleaseKeys(self.identities, f"{self.label} {IDENTITIES_FILE}")

    def file_sha256(self, rel: str) -> str:
        """sha256 of one of its files as a policy directory holds it (an evaluation suite's,
        which a report names); ConfigError naming the file when the document has none."""
        text = self.files.get(rel)
        if text is None:
            raise ConfigError(f"{self.label} {rel} is not in the policy")
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
