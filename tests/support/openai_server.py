"""An OpenAI-compatible chat server for tests, the demo and the bench: the wire protocol of
vLLM's ``/v1`` API without a model, and faults a real endpoint shows in production.

Why not a real model server: llama.cpp's server (``llama-cpp-python[server]`` 0.3.36) ships
only as a 76 MB source distribution for this platform and compiles llama.cpp on every fresh
install (measured: 453 CPU-seconds, about 4 minutes on two idle cores, 13.5 minutes niced on
the shared build machine). Tried with a random 2-layer GGUF written with ``gguf``: it answers
``response_format`` json_schema with HTTP 500 (it takes only text / json_object), its
grammar-constrained tool calls carry arguments that are not valid JSON, fixed prompts get
noise, and none of the faults below can be provoked. This server speaks the
protocol exactly (JSON bodies, SSE ``data:`` chunks over chunked encoding ending in ``[DONE]``,
tool calls streamed by index, ``response_format`` json_schema honoured, vLLM's error bodies)
and answers deterministically:

* ``tools`` given (and ``tool_choice`` not ``none``): a call of the chosen (else first) tool,
  with arguments generated from its JSON schema;
* ``response_format`` json_schema / json_object: a JSON instance of the schema;
* a prompt containing ``Reply with exactly: X``: the text ``X``; otherwise a short echo.

Like vLLM it answers to every name given to ``--served-model-name`` (each listed in
``/v1/models`` with ``root``, the ``--model`` path it "loaded", and ``max_model_len``; each
echoed in ``model``), counts prompts with a tokenizer and a chat template,
reports them in ``usage`` and at ``POST /tokenize`` (vLLM's body and answer: ``count``,
``max_model_len``, ``tokens``), and refuses a prompt over ``--max-model-len`` with vLLM's 400.
The tokenizer splits words into pieces of ``--chars-per-token`` characters (0: a word is a
token), so a small vocabulary can be provoked; completions count one token per word.

Faults (flags): ``--slow-first-token S``; ``--rate-limit F`` (fraction of requests answered
429, spread evenly) and ``--max-inflight N`` (429 beyond N requests in flight); ``--malformed-json``
(structured output and tool arguments cut short); serving other names (an endpoint started from
another tuple);
``--capacity N`` (per-token delay grows with requests in flight beyond N: a throughput knee);
``--error-rate F`` (fraction of completions answered 500, spread evenly: a degrading canary);
``--text-only`` (image parts refused with vLLM's 400, as by a model without vision);
``--follow-injections`` (obeys "reply only with the word X" found in a tool result);
``--chatty`` (text answers start with a pleasantry, so exact answers and code break);
``--jitter-ms LO-HI`` (a uniform random delay of LO to HI milliseconds before each completion's
first token: run-to-run noise); ``--slowdown F`` (every completion takes F times as long as it
otherwise would, whatever made it take that long: its first token and its end are each held
back by F - 1 times the time spent before them, so every quantile of TTFT and end-to-end latency
is F times larger; 1.3 is an endpoint 30% slower at p50 and p99); ``--hold-file PATH`` (every
completion holds its first token while PATH exists: requests kept in flight until the caller
removes it, however slow the machine); ``--access-log`` (a line on stderr per request answered,
as uvicorn logs in front of vLLM: when a reader such as a drain has read ``/metrics``);
``--answer TEXT`` (every completion answers TEXT: no tool call, no schema; an empty, refused,
hostile or over-long answer); ``--echo-url`` (every completion answered 500 with a body quoting
the URL it was sent to, credential included, as some proxies' error pages do); ``--model PATH`` (the ``root`` it reports; default
``/opt/ml/model``, where a render of the packaged profiles mounts the weights).
Image parts must be ``data:image/png;base64`` URLs of a real PNG (400 otherwise).
``/metrics``: vLLM's Prometheus metrics of the requests served (:mod:`.vllm_metrics`).
Connection refused is a port nobody listens on.

Run: ``python -m tests.support.openai_server --port P --served-model-name NAME [NAME...]``;
or :func:`start` (a subprocess on 127.0.0.1, stopped by its PID).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.ports import free_ports, stop, wait_listening
from tests.support.vllm_metrics import VllmMetrics

REPLY = re.compile(r"Reply with exactly:\s*(.+?)\s*$", re.MULTILINE)
INJECTION = re.compile(r"reply only with the word (\w+)", re.IGNORECASE)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Tokens a chat template adds around each message, and to open the assistant's turn.
MESSAGE_TOKENS = 3
GENERATION_PROMPT_TOKENS = 2


@dataclass
class Config:
    served_names: list[str]
    max_model_len: int = 8192
    token_delay: float = 0.0
    slow_first_token: float = 0.0
    rate_limit: float = 0.0
    max_inflight: int = 0
    malformed_json: bool = False
    capacity: int = 0
    error_rate: float = 0.0
    text_only: bool = False
    follow_injections: bool = False
    chatty: bool = False
    chars_per_token: int = 0
    #: vLLM's --model: reported as each model's ``root``.
    model: str = "/opt/ml/model"
    #: Answer every completion with this text (None: answer as described above).
    answer: str | None = None
    #: Answer every completion HTTP 500 with an error body quoting the URL it was sent to,
    #: the credential it came with in the URL's userinfo (a proxy's error page does this).
    echo_url: bool = False
    #: A uniform random delay before each completion's first token, in milliseconds (lo, hi).
    jitter_ms: tuple[float, float] = (0.0, 0.0)
    #: Every completion takes this many times as long (1.0: as it would).
    slowdown: float = 1.0
    #: While this file exists, every completion holds its first token: requests the caller
    #: keeps in flight for exactly as long as it needs them, and not a moment longer.
    hold_file: str | None = None
    #: A line on stderr per request answered, as uvicorn's access log in front of vLLM.
    access_log: bool = False


@dataclass
class State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    inflight: int = 0


def instance(schema: dict[str, Any]) -> Any:
    """A small value valid under ``schema`` (the subset structured-output schemas use)."""
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return instance(schema[key][0])
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties", {})
        return {name: instance(sub) for name, sub in props.items()}
    if kind == "array":
        return [instance(schema.get("items", {})) for _ in range(schema.get("minItems", 1))]
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1.5))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return "x" * max(1, schema.get("minLength", 5))


def tokenize(text: str, chars_per_token: int) -> list[int]:
    """Token ids of ``text``: each word, cut into pieces of ``chars_per_token`` characters."""
    ids = []
    for word in text.split():
        step = chars_per_token or len(word)
        ids += [zlib.crc32(word[i:i + step].encode()) % 50_000
                for i in range(0, len(word), step)]
    return ids


def chat_tokens(messages: list[dict[str, Any]], chars_per_token: int,
                add_generation_prompt: bool = True) -> list[int]:
    """The prompt a chat template makes of ``messages``, tokenized."""
    ids: list[int] = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        ids += [1] * MESSAGE_TOKENS + tokenize(str(content), chars_per_token)
    return ids + [2] * (GENERATION_PROMPT_TOKENS if add_generation_prompt else 0)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content
                        if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


def _last_user(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return _text(m.get("content"))
    return ""


def _image_problem(messages: list[dict[str, Any]], text_only: bool) -> str | None:
    """Why the images of a request cannot be read (vLLM answers 400), or None."""
    for m in messages:
        parts = m.get("content") if isinstance(m.get("content"), list) else []
        for part in parts:
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            if text_only:
                return "image input is not supported by this model"
            url = str((part.get("image_url") or {}).get("url", ""))
            head, _, data = url.partition(",")
            try:
                raw = base64.b64decode(data, validate=True)
            except ValueError:
                raw = b""
            if head != "data:image/png;base64" or not raw.startswith(PNG_SIGNATURE):
                return f"cannot load image from {url[:40]!r}"
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        if self.server.cfg.access_log:
            super().log_message(format, *args)

    # -- plumbing -------------------------------------------------------------------------

    def send_response(self, code: int, message: str | None = None) -> None:
        if self.path.startswith("/v1/"):
            self.server.metrics.answered(self.path.rstrip("/"), self.command, code)
        super().send_response(code, message)

    def _first_token(self) -> None:
        self._ttft = time.monotonic() - self._t0

    def _release(self) -> None:
        """This request stops counting as in flight. Called before the last bytes go out: once
        the client has them it may send its next request, which must not see this one."""
        if getattr(self, "_counted", False):
            self._counted = False
            with self.server.state.lock:
                self.server.state.inflight -= 1

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._release()
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None):
        # vLLM's error body (an OpenAI-style "error" object)
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
        self._send_json(status, body, headers)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # -- routes ---------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib's name
        cfg = self.server.cfg
        if self.path.rstrip("/") == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{
                "id": name, "object": "model", "created": int(time.time()),
                "owned_by": "k3a-fixture", "root": cfg.model,
                "max_model_len": cfg.max_model_len} for name in cfg.served_names]})
        elif self.path == "/health":
            self._send_json(200, {})
        elif self.path == "/metrics":
            data = self.server.metrics.exposition()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._error(404, f"no route {self.path}", "NotFoundError")

    def do_POST(self) -> None:  # noqa: N802 - stdlib's name
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        route = self.path.rstrip("/")
        if route not in ("/v1/chat/completions", "/tokenize"):
            self._error(404, f"no route {self.path}", "NotFoundError")
            return
        try:
            req = json.loads(raw)
        except ValueError:
            self._error(400, "request body is not JSON", "BadRequestError")
            return
        if route == "/tokenize":
            self._tokenize(req)
            return
        state, cfg = self.server.state, self.server.cfg
        with state.lock:
            state.requests += 1
            n, state.inflight = state.requests, state.inflight + 1
        self._counted = True
        metrics = self.server.metrics
        self._t0, self._ttft, self._finish = time.monotonic(), 0.0, None
        metrics.started()
        try:
            if self._spread(cfg.rate_limit, n) or (
                cfg.max_inflight and state.inflight > cfg.max_inflight
            ):
                self._error(429, "rate limited: too many requests", "RateLimitError",
                            {"retry-after-ms": "20"})
                return
            if self._spread(cfg.error_rate, n):
                self._error(500, "EngineCore encountered an issue", "InternalServerError")
                return
            if cfg.echo_url:
                self._error(500, f"upstream failed for {self._url_as_sent()}",
                            "InternalServerError")
                return
            self._complete(req)
        finally:
            self._release()
            if self._finish is None:
                metrics.failed()
            else:
                metrics.finished(e2e=time.monotonic() - self._t0, ttft=self._ttft,
                                 reason=self._finish)

    def _url_as_sent(self) -> str:
        """The URL of this request, with the Basic credential it carried as its userinfo."""
        scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
        userinfo = ""
        if scheme.lower() == "basic":
            userinfo = base64.b64decode(value).decode(errors="replace") + "@"
        elif scheme.lower() == "bearer":
            userinfo = f"key:{value}@"
        return f"http://{userinfo}{self.headers.get('Host')}{self.path}"

    @staticmethod
    def _spread(fraction: float, n: int) -> bool:
        # request n is picked when n * fraction crosses an integer: evenly spread
        return fraction > 0 and int(n * fraction) != int((n - 1) * fraction)

    def _unknown_model(self, req: dict[str, Any]) -> bool:
        if req.get("model") in self.server.cfg.served_names:
            return False
        self._error(404, f"The model `{req.get('model')}` does not exist.", "NotFoundError")
        return True

    def _tokenize(self, req: dict[str, Any]) -> None:
        """vLLM's ``/tokenize``: a completion ``prompt`` or chat ``messages``."""
        cfg = self.server.cfg
        if req.get("model") is not None and self._unknown_model(req):
            return
        if "messages" in req:
            ids = chat_tokens(req["messages"] or [], cfg.chars_per_token,
                              req.get("add_generation_prompt", True))
        else:
            ids = tokenize(str(req.get("prompt") or ""), cfg.chars_per_token)
        self._send_json(200, {"count": len(ids), "max_model_len": cfg.max_model_len,
                              "tokens": ids, "token_strs": None})

    def _complete(self, req: dict[str, Any]) -> None:
        cfg = self.server.cfg
        if self._unknown_model(req):
            return
        messages = req.get("messages") or []
        prompt_tokens = len(chat_tokens(messages, cfg.chars_per_token))
        if prompt_tokens > cfg.max_model_len:
            self._error(400, f"This model's maximum context length is {cfg.max_model_len} "
                        f"tokens. However, you requested {prompt_tokens} tokens in the "
                        "messages.", "BadRequestError")
            return
        problem = _image_problem(messages, cfg.text_only)
        if problem:
            self._error(400, problem, "BadRequestError")
            return
        max_tokens = req.get("max_completion_tokens") or req.get("max_tokens") or 64
        tool, text = self._answer(req, messages)
        words = text.split(" ") if tool is None else [text]
        finish = "tool_calls" if tool else "stop"
        if tool is None and len(words) > max_tokens:
            words, finish = words[:max_tokens], "length"
        if tool is None:
            text = " ".join(words)
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                 "total_tokens": prompt_tokens + len(words)}
        self._finish = finish
        if req.get("stream"):
            self._stream(cid, req, tool, text, words, finish, usage)
            return
        self._pace(len(words))
        message: dict[str, Any] = {"role": "assistant", "content": None if tool else text}
        if tool:
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                      "function": {"name": tool, "arguments": text}}]
        self._send_json(200, {
            "id": cid, "object": "chat.completion", "created": int(time.time()),
            "model": req["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}],
            "usage": usage})

    def _answer(
        self, req: dict[str, Any], messages: list[dict[str, Any]]
    ) -> tuple[str | None, str]:
        """(tool name or None, text): the tool call's arguments or the reply's content."""
        cfg = self.server.cfg
        if cfg.answer is not None:
            return None, cfg.answer
        tools = req.get("tools") or []
        choice = req.get("tool_choice")
        if tools and choice != "none":
            chosen = tools[0]["function"]
            if isinstance(choice, dict):
                wanted = choice.get("function", {}).get("name")
                chosen = next((t["function"] for t in tools if t["function"]["name"] == wanted),
                              chosen)
            args = json.dumps(instance(chosen.get("parameters") or {}))
            return chosen["name"], args[: len(args) // 2] if cfg.malformed_json else args
        fmt = req.get("response_format") or {}
        if fmt.get("type") in ("json_schema", "json_object"):
            schema = (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
            body = json.dumps(instance(schema))
            return None, body[: len(body) // 2] if cfg.malformed_json else body
        if cfg.follow_injections:
            for m in messages:
                obeyed = m.get("role") == "tool" and INJECTION.search(_text(m.get("content")))
                if obeyed:
                    return None, obeyed.group(1)
        pleasantry = "Sure! Here you go: " if cfg.chatty else ""
        found = REPLY.search(_last_user(messages))
        if found:
            return None, pleasantry + found.group(1)
        tail = " ".join(_last_user(messages).split()[:8])
        return None, f"{pleasantry}Echo from the fixture: {tail}".strip()

    def _per_token(self) -> float:
        cfg, inflight = self.server.cfg, self.server.state.inflight
        if cfg.capacity and inflight > cfg.capacity:
            return cfg.token_delay * inflight / cfg.capacity
        return cfg.token_delay

    def _before_first_token(self) -> None:
        cfg = self.server.cfg
        while cfg.hold_file is not None and os.path.exists(cfg.hold_file):
            time.sleep(0.01)
        time.sleep(cfg.slow_first_token + random.uniform(*cfg.jitter_ms) / 1000)
        self._stretch(self._t0)

    def _stretch(self, since: float) -> None:
        """Hold back by ``slowdown - 1`` times the time spent since ``since``."""
        extra = (self.server.cfg.slowdown - 1) * (time.monotonic() - since)
        if extra > 0:
            time.sleep(extra)

    def _pace(self, tokens: int) -> None:
        per_token = self._per_token()
        time.sleep(per_token)
        self._before_first_token()
        self._first_token()
        first = time.monotonic()
        time.sleep(per_token * max(0, tokens - 1))
        self._stretch(first)

    def _stream(self, cid: str, req: dict[str, Any], tool: str | None, text: str,
                words: list[str], finish: str, usage: dict[str, int]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": req["model"]}

        def event(delta: dict[str, Any], reason: str | None = None) -> None:
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                          "finish_reason": reason}]}
            self._chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        self._before_first_token()
        event({"role": "assistant", "content": ""})
        self._first_token()
        first = time.monotonic()
        for delta in self._deltas(tool, text, words):
            time.sleep(self._per_token())
            event(delta)
        self._stretch(first)
        event({}, finish)
        if (req.get("stream_options") or {}).get("include_usage"):
            self._chunk(b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode()
                        + b"\n\n")
        self._release()  # the client is done at [DONE]
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    @staticmethod
    def _deltas(tool: str | None, text: str, words: list[str]) -> Iterator[dict[str, Any]]:
        if tool:
            yield {"tool_calls": [{"index": 0, "id": f"call_{uuid.uuid4().hex[:12]}",
                                   "type": "function",
                                   "function": {"name": tool, "arguments": ""}}]}
            step = max(1, len(text) // 4)
            for i in range(0, len(text), step):
                yield {"tool_calls": [{"index": 0, "function": {"arguments": text[i:i + step]}}]}
            return
        for i, word in enumerate(words):
            yield {"content": word if i == 0 else " " + word}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The stdlib's backlog of 5 resets connections when a sweep opens 16 at once: that would be
    # the fixture failing, not the fault under test.
    request_queue_size = 256

    def __init__(self, port: int, cfg: Config):
        super().__init__(("127.0.0.1", port), Handler)
        self.cfg = cfg
        self.state = State()
        # vLLM labels its metrics with the first served model name.
        self.metrics = VllmMetrics(cfg.served_names[0])


def _parse(argv: list[str]) -> tuple[int, Config]:
    p = argparse.ArgumentParser(prog="python -m tests.support.openai_server")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", dest="served_names", nargs="+", required=True)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--slow-first-token", type=float, default=0.0)
    p.add_argument("--rate-limit", type=float, default=0.0)
    p.add_argument("--max-inflight", type=int, default=0)
    p.add_argument("--malformed-json", action="store_true")
    p.add_argument("--capacity", type=int, default=0)
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--text-only", action="store_true")
    p.add_argument("--follow-injections", action="store_true")
    p.add_argument("--chatty", action="store_true")
    p.add_argument("--chars-per-token", type=int, default=0)
    p.add_argument("--model", default=Config.model)
    p.add_argument("--answer", default=None)
    p.add_argument("--echo-url", action="store_true")
    p.add_argument("--jitter-ms", type=_span, default=(0.0, 0.0), metavar="LO-HI")
    p.add_argument("--slowdown", type=float, default=1.0)
    p.add_argument("--hold-file", default=None, metavar="PATH")
    p.add_argument("--access-log", action="store_true")
    a = p.parse_args(argv)
    return a.port, Config(a.served_names, a.max_model_len, a.token_delay, a.slow_first_token,
                          a.rate_limit, a.max_inflight, a.malformed_json, a.capacity,
                          error_rate=a.error_rate, text_only=a.text_only,
                          follow_injections=a.follow_injections, chatty=a.chatty,
                          chars_per_token=a.chars_per_token, model=a.model, answer=a.answer,
                          echo_url=a.echo_url, jitter_ms=a.jitter_ms, slowdown=a.slowdown,
                          hold_file=a.hold_file, access_log=a.access_log)


def _span(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition("-")
    try:
        span = (float(lo), float(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LO-HI in milliseconds") from None
    if not 0 <= span[0] <= span[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= LO <= HI")
    return span


@dataclass
class FixtureServer:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        stop(self.proc)


def start(served_names: str | Sequence[str], log: Path, **faults: Any) -> FixtureServer:
    """Start the server as a subprocess on a free loopback port, answering to ``served_names``
    (one name or several, as vLLM's ``--served-model-name``); ``faults``: Config fields."""
    (port,) = free_ports(1)
    names = [served_names] if isinstance(served_names, str) else list(served_names)
    args = [sys.executable, "-m", "tests.support.openai_server", "--port", str(port),
            "--served-model-name", *names]
    for name, value in faults.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value not in (False, None):
            args += [flag, str(value)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        # From the checkout's root, where `tests.support` is importable.
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[2])
    try:
        wait_listening(port, proc, log, "openai fixture server", timeout=20)
    except Exception:
        stop(proc)
        raise
    return FixtureServer(proc, port)


def main(argv: list[str] | None = None) -> None:
    port, cfg = _parse(sys.argv[1:] if argv is None else argv)
    server = _Server(port, cfg)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
