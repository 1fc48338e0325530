"""What a readiness run asks and how it judges: settings for the built-in smoke checks, and
evaluation suites (versioned YAML files in ``policies/eval-suites/``).

A suite is identified by the sha256 of its file's bytes, recorded in every report: the gate
accepts only a report of the exact file the channel policy names, so editing a suite (or
running another) cannot pass for the reviewed one.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Slo(_Strict):
    """Where the concurrency sweep stops: the first level breaking any of these."""

    ttft_p99_s: float = Field(default=2.0, gt=0)
    e2e_p99_s: float = Field(default=30.0, gt=0)
    #: Failed and rate-limited (429) requests together, as a fraction of a level's requests.
    max_error_rate: float = Field(default=0.01, ge=0, le=1)


class SweepSettings(_Strict):
    max_concurrency: int = Field(default=16, gt=0)
    #: Requests per level: this many per concurrent worker (at least 4 in all).
    requests_per_worker: int = Field(default=2, gt=0)
    max_tokens: int = Field(default=32, gt=0)


class SmokeSettings(_Strict):
    """The knobs of the built-in checks; their canonical digest is a smoke report's suite id."""

    #: Seconds one request may take (between streamed chunks, for a stream); bounded retries.
    request_timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=5)
    #: Prompt size of the long-context check, in tokens; None: the profile's max model length
    #: less room for the answer, capped at ``long_context_cap``.
    long_context_tokens: int | None = Field(default=None, gt=0)
    long_context_cap: int = Field(default=32768, gt=0)
    slo: Slo = Slo()
    sweep: SweepSettings = SweepSettings()

    def digest(self) -> str:
        return canonical_digest(self)


class CodeInput(_Strict):
    args: list[Any]
    expect: Any


class CodeCheck(_Strict):
    """``code`` cases: the answer defines ``entry``; it is run on each input, contained
    (``readiness/code_run.py``), and must return what is expected."""

    entry: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    inputs: list[CodeInput] = Field(min_length=1)
    timeout_s: float = Field(default=10.0, gt=0, le=60)


class Case(_Strict):
    """One prompt of a suite and how its answer is judged.

    No case may pass on an empty answer unless it says that is what it asks for
    (``empty_answer_passes``): a suite file where one would is refused. A text answer cut at
    ``max_tokens`` fails an ``exact``, ``not_regex`` or ``json_schema`` case (what it would
    have said next is unknown); a ``regex`` case is judged on what arrived."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    prompt: str = Field(min_length=1)
    system: str | None = None
    max_tokens: int = Field(default=256, gt=0)
    check: Literal["exact", "regex", "not_regex", "json_schema", "tool_name", "code"]
    #: exact: the stripped answer equals this; regex: re.search matches it; not_regex: it
    #: must not (an injected instruction not followed); tool_name: the function to call.
    expect: str | None = None
    #: not_regex: a regex the answer must match all the same (the task was done), so that an
    #: empty or refused answer does not pass for one that resisted the injection.
    require: str | None = None
    #: The case asks for an empty answer (or accepts one): the only way one may pass.
    empty_answer_passes: bool = False
    #: json_schema: the schema sent as ``response_format`` and validated against.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    #: tool_name: the tools offered (OpenAI ``tools`` entries).
    tools: list[dict[str, Any]] | None = None
    #: code: the function to run and its inputs.
    code: CodeCheck | None = None
    #: Earlier turns (OpenAI messages) before the prompt: a tool call and its result, say.
    context: list[dict[str, Any]] | None = None
    #: A small PNG (base64) sent with the prompt as an ``image_url`` data: URL part.
    image_png_b64: str | None = None
    #: Long context: this many filler words before the prompt.
    filler_words: int | None = Field(default=None, gt=0)
    #: Long context sized to the endpoint: filler before the prompt up to the run's
    #: long-context size (the tuple's --max-model-len, else the server's, less room for the
    #: answer, at most ``smoke.long_context_cap``), counted in the endpoint's own tokens.
    long_context: bool = False

    @model_validator(mode="after")
    def _fields_for_check(self) -> Case:
        if self.check in ("exact", "regex", "not_regex", "tool_name") and self.expect is None:
            raise ValueError(f"a {self.check} check needs `expect`")
        if self.check == "code" and self.code is None:
            raise ValueError("a code check needs `code: {entry: ..., inputs: [...]}`")
        if self.check in ("regex", "not_regex"):
            try:
                re.compile(self.expect or "")
            except re.error as exc:
                raise ValueError(f"expect is not a valid regex: {exc}") from None
        if self.check == "json_schema" and self.schema_ is None:
            raise ValueError("a json_schema check needs `schema`")
        if self.check == "tool_name" and not self.tools:
            raise ValueError("a tool_name check needs `tools`")
        if self.require is not None:
            if self.check != "not_regex":
                raise ValueError("`require` belongs to not_regex checks")
            try:
                re.compile(self.require)
            except re.error as exc:
                raise ValueError(f"require is not a valid regex: {exc}") from None
        if self.long_context and self.filler_words:
            raise ValueError("`long_context` sizes the filler itself: drop `filler_words`")
        if self.passes_empty() and not self.empty_answer_passes:
            raise ValueError(
                f"this {self.check} check passes on an empty answer: ask for something the "
                "answer must hold (a not_regex check: `require`), or say "
                "`empty_answer_passes: true` if that is what the case asks for")
        return self

    def passes_empty(self) -> bool:
        """Whether an empty answer meets the check (json_schema, tool_name and code never)."""
        if self.check == "exact":
            return self.expect == ""
        if self.check == "regex":
            return re.search(self.expect or "", "") is not None
        if self.check == "not_regex":
            return self.require is None or re.search(self.require, "") is not None
        return False


class Suite(_Strict):
    schema_version: Literal[1] = 1
    name: str = Field(min_length=1)
    description: str = ""
    #: The run's own verdict (exit code); the gate applies the channel policy's thresholds.
    min_pass_rate: float = Field(default=1.0, ge=0, le=1)
    smoke: SmokeSettings = SmokeSettings()
    cases: list[Case] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Suite:
        names = [c.name for c in self.cases]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"case names are used twice: {', '.join(dupes)}")
        return self


def file_sha256(path: Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise ConfigError(f"suite file {path} cannot be read: {exc.strerror}") from None


def load_suite(path: Path) -> tuple[Suite, str]:
    """The suite in ``path`` and the sha256 of the file's bytes (read once)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"suite file {path} cannot be read: {exc.strerror}",
            hint="name a suite of the policy in force (`--suite k3-core`) or a suite file",
        ) from None
    return parse_suite(data, f"suite file {path}")


def parse_suite(data: bytes, where: str) -> tuple[Suite, str]:
    """The suite in ``data`` (``where`` names it in errors) and the sha256 of those bytes."""
    try:
        suite = Suite.model_validate(yaml.safe_load(data))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<top>'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{where} is malformed: {problems}") from None
    return suite, hashlib.sha256(data).hexdigest()
