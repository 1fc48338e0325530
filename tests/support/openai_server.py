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

Tokens are whitespace-separated words, for ``max_tokens``, ``usage`` and the context limit.

Faults (flags): ``--slow-first-token S``; ``--rate-limit F`` (fraction of requests answered
429, spread evenly) and ``--max-inflight N`` (429 beyond N requests in flight); ``--malformed-json``
(structured output and tool arguments cut short); ``--served-name`` (serve another model name);
``--capacity N`` (per-token delay grows with requests in flight beyond N: a throughput knee).
Connection refused is a port nobody listens on.

Run: ``python -m tests.support.openai_server --port P --served-name NAME``; or
:func:`start` (a subprocess on 127.0.0.1, stopped by its PID).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.ports import free_ports, stop, wait_listening

REPLY = re.compile(r"Reply with exactly:\s*(.+?)\s*$", re.MULTILINE)


@dataclass
class Config:
    served_name: str
    max_model_len: int = 8192
    token_delay: float = 0.0
    slow_first_token: float = 0.0
    rate_limit: float = 0.0
    max_inflight: int = 0
    malformed_json: bool = False
    capacity: int = 0


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


def _words(messages: list[dict[str, Any]]) -> int:
    count = 0
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        count += len(str(content).split())
    return count


def _last_user(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"]
    return ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        pass

    # -- plumbing -------------------------------------------------------------------------

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
                "id": cfg.served_name, "object": "model", "created": int(time.time()),
                "owned_by": "k3a-fixture", "root": cfg.served_name,
                "max_model_len": cfg.max_model_len}]})
        elif self.path == "/health":
            self._send_json(200, {})
        else:
            self._error(404, f"no route {self.path}", "NotFoundError")

    def do_POST(self) -> None:  # noqa: N802 - stdlib's name
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route {self.path}", "NotFoundError")
            return
        try:
            req = json.loads(raw)
        except ValueError:
            self._error(400, "request body is not JSON", "BadRequestError")
            return
        state, cfg = self.server.state, self.server.cfg
        with state.lock:
            state.requests += 1
            n, state.inflight = state.requests, state.inflight + 1
        self._counted = True
        try:
            # request n is limited when n * fraction crosses an integer: evenly spread 429s
            rate = cfg.rate_limit
            limited = rate > 0 and int(n * rate) != int((n - 1) * rate)
            if limited or (cfg.max_inflight and state.inflight > cfg.max_inflight):
                self._error(429, "rate limited: too many requests", "RateLimitError",
                            {"retry-after-ms": "20"})
                return
            self._complete(req)
        finally:
            self._release()

    def _complete(self, req: dict[str, Any]) -> None:
        cfg = self.server.cfg
        if req.get("model") != cfg.served_name:
            self._error(404, f"The model `{req.get('model')}` does not exist.", "NotFoundError")
            return
        messages = req.get("messages") or []
        prompt_tokens = _words(messages)
        if prompt_tokens > cfg.max_model_len:
            self._error(400, f"This model's maximum context length is {cfg.max_model_len} "
                        f"tokens. However, you requested {prompt_tokens} tokens in the "
                        "messages.", "BadRequestError")
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
            "model": cfg.served_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}],
            "usage": usage})

    def _answer(
        self, req: dict[str, Any], messages: list[dict[str, Any]]
    ) -> tuple[str | None, str]:
        """(tool name or None, text): the tool call's arguments or the reply's content."""
        cfg = self.server.cfg
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
        found = REPLY.search(_last_user(messages))
        if found:
            return None, found.group(1)
        tail = " ".join(_last_user(messages).split()[:8])
        return None, f"Echo from the fixture: {tail}".strip()

    def _per_token(self) -> float:
        cfg, inflight = self.server.cfg, self.server.state.inflight
        if cfg.capacity and inflight > cfg.capacity:
            return cfg.token_delay * inflight / cfg.capacity
        return cfg.token_delay

    def _pace(self, tokens: int) -> None:
        time.sleep(self.server.cfg.slow_first_token + self._per_token() * tokens)

    def _stream(self, cid: str, req: dict[str, Any], tool: str | None, text: str,
                words: list[str], finish: str, usage: dict[str, int]) -> None:
        cfg = self.server.cfg
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": cfg.served_name}

        def event(delta: dict[str, Any], reason: str | None = None) -> None:
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                          "finish_reason": reason}]}
            self._chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        time.sleep(cfg.slow_first_token)
        event({"role": "assistant", "content": ""})
        for delta in self._deltas(tool, text, words):
            time.sleep(self._per_token())
            event(delta)
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


def _parse(argv: list[str]) -> tuple[int, Config]:
    p = argparse.ArgumentParser(prog="python -m tests.support.openai_server")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-name", required=True)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--slow-first-token", type=float, default=0.0)
    p.add_argument("--rate-limit", type=float, default=0.0)
    p.add_argument("--max-inflight", type=int, default=0)
    p.add_argument("--malformed-json", action="store_true")
    p.add_argument("--capacity", type=int, default=0)
    a = p.parse_args(argv)
    return a.port, Config(a.served_name, a.max_model_len, a.token_delay, a.slow_first_token,
                          a.rate_limit, a.max_inflight, a.malformed_json, a.capacity)


@dataclass
class FixtureServer:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        stop(self.proc)


def start(served_name: str, log: Path, **faults: Any) -> FixtureServer:
    """Start the server as a subprocess on a free loopback port; ``faults``: Config fields."""
    (port,) = free_ports(1)
    args = [sys.executable, "-m", "tests.support.openai_server", "--port", str(port),
            "--served-name", served_name]
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
