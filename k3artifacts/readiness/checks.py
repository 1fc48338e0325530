"""The checks: each sends real requests and returns a named :class:`CheckResult`, never raises.

The built-in readiness checks (``models``, ``chat``, ``stream``, ``structured_output``,
``tool_call``, ``long_context``) and the suite cases share one judge (:func:`judge_case`), so
a structured-output or tool-call answer is held to the same rules wherever it is asked.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import openai

from k3artifacts.readiness.client import describe
from k3artifacts.readiness.code_run import NoSandbox, run_cases, sandbox
from k3artifacts.readiness.redact import Redactor
from k3artifacts.readiness.suite import Case, SmokeSettings
from k3artifacts.releases.evaluations import CheckResult
from k3artifacts.releases.tuples import TUPLE_ID

STRUCTURED = Case(
    name="structured_output",
    prompt="Describe the city of Lyon as JSON: its name and its population.",
    max_tokens=128,
    check="json_schema",
    schema={
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1},
            "population": {"type": "integer", "minimum": 0},
        },
        "required": ["city", "population"],
        "additionalProperties": False,
    },
)
TOOL = Case(
    name="tool_call",
    prompt="What is the weather in Oslo? Use the tool.",
    max_tokens=128,
    check="tool_name",
    expect="get_weather",
    tools=[{"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    }}],
)


#: Model names kept of what a server answered with (each bounded like any text from it).
MAX_SEEN_MODELS = 16


@dataclass
class Probe:
    """One endpoint as the checks see it: a bounded client, the tuple id (a rendered server
    answers to it as a served model name, and every request asks for it), and every model name
    the server answered with (collected for the report). Every text the server sends goes
    through ``redactor`` before a detail quotes it."""

    client: openai.OpenAI
    model: str
    settings: SmokeSettings
    seen_models: list[str] = field(default_factory=list)
    redactor: Redactor = field(default_factory=Redactor.of_process)
    #: Prompt size of long-context cases, in tokens (None: from the server's max_model_len).
    long_context_tokens: int | None = None
    _cards: list[Any] | None = None

    def cards(self) -> list[Any]:
        """``/v1/models``' entries, listed once (a failure is raised, and asked again)."""
        if self._cards is None:
            self._cards = list(self.client.models.list())
        return self._cards

    def card(self) -> dict[str, Any] | None:
        """What the server says of the model it serves as the tuple id (vLLM: ``root``, the
        path it loaded, and ``max_model_len``); None when it does not serve it."""
        for m in self.cards():
            if m.id == self.model:
                return dict(m.model_extra or {})
        return None

    def saw(self, name: str | None) -> None:
        if not name or len(self.seen_models) >= MAX_SEEN_MODELS:
            return
        name = self.redactor(name)
        if name not in self.seen_models:
            self.seen_models.append(name)


def timed(name: str, fn: Callable[[], tuple[bool, str]], *, kind: str | None = None,
          retries: int = 0) -> CheckResult:
    start = time.monotonic()
    try:
        passed, detail = fn()
    except Exception as exc:  # a check reports what went wrong; it never ends the run
        passed, detail = False, describe(exc, retries)
    return CheckResult(name=name, passed=passed, detail=detail, kind=kind,
                       seconds=round(time.monotonic() - start, 4))


def models_check(probe: Probe) -> tuple[CheckResult, bool]:
    """(result, reachable): whether /v1/models lists the tuple id. Every tuple of a profile
    shares its served model name, so only the id says which weights answer."""
    reachable = True

    def run() -> tuple[bool, str]:
        nonlocal reachable
        try:
            listed = [m.id for m in probe.cards()]
        except openai.APIConnectionError:
            reachable = False
            raise
        for name in listed:
            probe.saw(name)
        if probe.model in listed:
            return True, f"serves {probe.model}"
        tuples = [name for name in listed if TUPLE_ID.match(name)]
        if tuples:
            return False, (f"serves tuple(s) {', '.join(tuples)}, not {probe.model}: the endpoint "
                           "was started from another tuple's render")
        return False, (f"serves {listed or 'nothing'} and no tuple id, not {probe.model}: "
                       "not started from a render of this tuple (`k3a render` adds its id as a "
                       "served model name)")

    return timed("models", run, retries=probe.settings.max_retries), reachable


def chat_check(probe: Probe) -> CheckResult:
    def run() -> tuple[bool, str]:
        resp = probe.client.chat.completions.create(
            model=probe.model, max_tokens=16, temperature=0,
            messages=[{"role": "user", "content": "Reply with exactly: READY"}],
        )
        probe.saw(resp.model)
        if not resp.choices:
            return False, "the completion has no choices"
        text = (resp.choices[0].message.content or "").strip()
        if not text:
            return False, f"empty answer (finish_reason {resp.choices[0].finish_reason})"
        return True, f"{len(text)} chars, finish_reason {resp.choices[0].finish_reason}"

    return timed("chat", run, retries=probe.settings.max_retries)


def stream_check(probe: Probe) -> CheckResult:
    slo = probe.settings.slo.ttft_p99_s

    def run() -> tuple[bool, str]:
        start = time.monotonic()
        ttft = None
        tokens, finish = 0, None
        stream = probe.client.chat.completions.create(
            model=probe.model, max_tokens=32, temperature=0, stream=True,
            messages=[{"role": "user", "content": "Count from one to ten in words."}],
        )
        for chunk in stream:
            probe.saw(chunk.model)
            for choice in chunk.choices:
                if choice.delta.content:
                    tokens += 1
                    ttft = ttft if ttft is not None else time.monotonic() - start
                finish = choice.finish_reason or finish
        if not tokens:
            return False, f"no token streamed (finish_reason {finish})"
        if finish is None:
            return False, f"{tokens} chunk(s) but the stream ended without a finish reason"
        assert ttft is not None
        if ttft > slo:
            return False, f"first token after {ttft:.2f} s, over the {slo:g} s SLO"
        return True, f"first token after {ttft:.3f} s, {tokens} chunk(s), finish_reason {finish}"

    return timed("stream", run, retries=probe.settings.max_retries)


def judge_case(probe: Probe, case: Case, *, tool_choice: Any = "auto",
               kind: str | None = None) -> CheckResult:
    if case.check == "code":
        try:
            sandbox()
        except NoSandbox as exc:  # never run a model's code uncontained: not asked at all
            return CheckResult(name=case.name, passed=False, kind=kind, skipped=str(exc),
                               detail=f"not run: no sandbox for the model's code: {exc}")
    extra: dict[str, Any] = {}
    if case.check == "json_schema":
        extra["response_format"] = {"type": "json_schema", "json_schema": {
            "name": re.sub(r"[^A-Za-z0-9_-]", "_", case.name), "schema": case.schema_,
            "strict": True}}
    if case.check == "tool_name":
        extra["tools"] = case.tools
        extra["tool_choice"] = tool_choice

    def run() -> tuple[bool, str]:
        if case.long_context:
            tokens = probe.long_context_tokens or server_context_tokens(probe)
            repeats, _, _ = fit_filler(probe, tokens, lambda n: case_messages(case, n))
            messages = case_messages(case, repeats)
        else:
            messages = case_messages(case)
        resp = probe.client.chat.completions.create(
            model=probe.model, messages=messages, max_tokens=case.max_tokens, temperature=0,
            **extra)
        probe.saw(resp.model)
        if not resp.choices:
            return False, "the completion has no choices"
        message = resp.choices[0].message
        scrub = probe.redactor.scrub
        if case.check == "tool_name":
            return _judge_tool(case, message, scrub)
        text = scrub(message.content or "").strip()
        finish = resp.choices[0].finish_reason
        if finish == "length" and case.check in ("exact", "not_regex", "json_schema"):
            return False, (f"answer cut at max_tokens ({case.max_tokens}): "
                           f"{_clip(text)!r}; what followed is unknown")
        if case.check == "exact":
            return (text == case.expect,
                    f"answered {_clip(text)!r}" + ("" if text == case.expect
                                                   else f", expected {case.expect!r}"))
        if case.check == "regex":
            found = re.search(case.expect or "", text) is not None
            return found, f"answered {_clip(text)!r}" + ("" if found
                                                          else f", no match for {case.expect!r}")
        if case.check == "not_regex":
            found = re.search(case.expect or "", text) is not None
            done = case.require is None or re.search(case.require, text) is not None
            return (not found and done and not message.tool_calls,
                    f"answered {_clip(text)!r}" + (f", which matches {case.expect!r}" if found
                                                   else "")
                    + ("" if done else f", no match for {case.require!r}")
                    + (", and called a tool" if message.tool_calls else ""))
        if case.check == "code":
            assert case.code is not None
            return run_cases(sandbox(), text, case.code.entry,
                             [(i.args, i.expect) for i in case.code.inputs], case.code.timeout_s,
                             scrub=scrub)
        return _judge_json(text, case.schema_ or {})

    return timed(case.name, run, kind=kind, retries=probe.settings.max_retries)


def case_messages(case: Case, repeats: int = 0) -> list[dict[str, Any]]:
    """The case's conversation; ``repeats``: filler before a long-context case's prompt."""
    return ([{"role": "system", "content": case.system}] if case.system else []) + [
        *(case.context or []), {"role": "user", "content": case_content(case, repeats)}]


def case_content(case: Case, repeats: int = 0) -> str | list[dict[str, Any]]:
    """The user turn: the prompt after any filler, with the case's image as a data: URL."""
    text = case.prompt
    if repeats:
        text = f"{FILLER * repeats}\n\n{text}"
    elif case.filler_words:
        filler = " ".join(("alpha", "bravo", "charlie", "delta")[i % 4]
                          for i in range(case.filler_words))
        text = f"{filler}\n\n{text}"
    if case.image_png_b64 is None:
        return text
    return [{"type": "text", "text": text},
            {"type": "image_url",
             "image_url": {"url": f"data:image/png;base64,{case.image_png_b64}"}}]


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _judge_json(text: str, schema: dict[str, Any]) -> tuple[bool, str]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        return False, f"malformed JSON: {exc.msg} at char {exc.pos} of {_clip(text)!r}"
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(
        value))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top)"
        return False, f"JSON does not match the schema at {where}: {error.message}"
    return True, f"valid JSON under the schema: {_clip(text)}"


def _judge_tool(case: Case, message: Any, scrub: Callable[[str], str]) -> tuple[bool, str]:
    calls = message.tool_calls or []
    if not calls:
        return False, f"no tool call; answered {_clip(scrub(message.content or ''))!r}"
    call = calls[0]
    name, arguments = scrub(call.function.name or ""), scrub(call.function.arguments or "")
    if name != case.expect:
        return False, f"called {_clip(name)!r}, expected {case.expect!r}"
    params = next((t["function"].get("parameters") or {} for t in case.tools or []
                   if t["function"]["name"] == name), {})
    ok, detail = _judge_json(arguments, params)
    if not ok:
        return False, f"{name} arguments: {detail}"
    return True, f"called {name}({_clip(arguments)})"


FILLER = "alpha bravo charlie delta "
#: Filler repeats of the first measurement; the second doubles it (their difference is the
#: cost of one repeat in the endpoint's own tokens, the rest is the template and the question).
SAMPLE_REPEATS = 32


def _long_messages(repeats: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": FILLER * repeats + "\n\nReply with exactly: DONE"}]


class TokenCounter:
    """Prompt tokens as the endpoint counts them: vLLM's ``POST /tokenize`` (the chat template
    applied), else a one-token completion's ``usage.prompt_tokens``."""

    def __init__(self, probe: Probe):
        self.probe = probe
        self.how = "/tokenize"

    def __call__(self, messages: list[dict[str, Any]]) -> int:
        if self.how == "/tokenize":
            try:
                found = self.probe.client.post(
                    str(self.probe.client.base_url).rstrip("/").removesuffix("/v1") + "/tokenize",
                    body={"model": self.probe.model, "messages": messages,
                          "add_generation_prompt": True},
                    cast_to=object)
                return int(found["count"])  # type: ignore[index]
            except (openai.NotFoundError, openai.BadRequestError, openai.UnprocessableEntityError,
                    KeyError, TypeError, ValueError):
                self.how = "usage.prompt_tokens"  # not vLLM: ask a completion instead
        resp = self.probe.client.chat.completions.create(
            model=self.probe.model, max_tokens=1, temperature=0, messages=messages)
        if resp.usage is None:
            raise ValueError("the endpoint reports no usage and has no /tokenize: prompt "
                             "tokens cannot be counted")
        return resp.usage.prompt_tokens


#: Room left for the answer when a long prompt is sized from the max model length.
ANSWER_ROOM = 512


def context_tokens(settings: SmokeSettings, max_len: int | None) -> int:
    """Long-context prompt size: the configured one, else ``max_len`` (the tuple's, else the
    server's) less room for the answer, capped: a 128k-token prompt on every promotion costs
    minutes of GPU prefill."""
    if settings.long_context_tokens:
        return settings.long_context_tokens
    limit = max_len or settings.long_context_cap
    return max(1, min(limit - ANSWER_ROOM, settings.long_context_cap))


def listed_max_len(probe: Probe) -> int | None:
    """The server's own ``max_model_len`` (vLLM lists it in /v1/models; others may not)."""
    try:
        card = probe.card()
    except Exception:  # the models check has already reported any failure to list
        return None
    value = (card or {}).get("max_model_len")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def server_context_tokens(probe: Probe) -> int:
    return context_tokens(probe.settings, listed_max_len(probe))


def fit_filler(probe: Probe, tokens: int,
               make: Callable[[int], list[dict[str, Any]]]) -> tuple[int, int, str]:
    """(filler repeats, tokens, how counted): the most repeats of :data:`FILLER` for which
    ``make``'s messages are at most ``tokens`` tokens as the endpoint's tokenizer counts them
    (no words-per-token guess: vocabularies differ by a factor of several)."""
    count = TokenCounter(probe)
    small = count(make(SAMPLE_REPEATS))
    per = (count(make(2 * SAMPLE_REPEATS)) - small) / SAMPLE_REPEATS
    if per <= 0:
        raise ValueError(f"the endpoint counts no tokens for more text ({count.how})")
    fixed = small - per * SAMPLE_REPEATS
    repeats = max(1, int((tokens - fixed) / per))
    measured = count(make(repeats))
    while measured > tokens and repeats > 1:  # a tokenizer merging across repeats
        repeats = max(1, repeats - max(1, math.ceil((measured - tokens) / per)))
        measured = count(make(repeats))
    return repeats, measured, count.how


def long_context_check(probe: Probe, tokens: int) -> CheckResult:
    """A prompt of ``tokens`` tokens as the endpoint counts them, answered in full."""

    def run() -> tuple[bool, str]:
        repeats, measured, how = fit_filler(probe, tokens, _long_messages)
        resp = probe.client.chat.completions.create(
            model=probe.model, max_tokens=16, temperature=0, messages=_long_messages(repeats))
        probe.saw(resp.model)
        text = (resp.choices[0].message.content or "").strip() if resp.choices else ""
        if not text:
            return False, "empty answer to the long prompt"
        seen = resp.usage.prompt_tokens if resp.usage else None
        if seen is not None and seen < measured:
            return False, (f"server counted {seen} prompt tokens for a prompt of {measured} "
                           f"({how}): truncated?")
        return True, (f"{seen if seen is not None else measured} prompt tokens accepted "
                      f"(target {tokens}, measured with {how})")

    return timed("long_context", run, retries=probe.settings.max_retries)
