"""An OpenAI-compatible stub server on 127.0.0.1, so LLM and embedding code runs through the real litellm with
no network and no API key.

Tests script it: a default responder per route, plus one-shot `StubReply` objects (429 with Retry-After, 5xx,
400, slow replies, malformed bodies) served first, in order. It records every request and the highest number
of requests it saw in flight at once. `python -m tests.stub_server --port N` runs it standalone for bench/.

`citing(*numbers)` answers by citing a prompt's numbered passages, repeats included. The failure modes of real
servers have helpers: `StubReply(finish_reason="length")` for an answer cut at max_tokens, `context_exceeded(n)`
for llama.cpp's (and OpenAI's) 400 when a prompt does not fit, and `free_port()` for a server that is not running
(connection refused).
"""

from __future__ import annotations

import argparse
import contextlib
import base64
import hashlib
import json
import math
import re
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT = "/chat/completions"
EMBED = "/embeddings"
RERANK = "/rerank"
EMBED_DIM = 8

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


@dataclass
class StubReply:
    """One scripted answer. `content` is the chat text (or, for non-200, the error message); `raw_body` replaces
    the whole body verbatim (malformed JSON and the like); `delay` sleeps before answering."""

    status: int = 200
    content: str | dict | None = None   # a dict: a structured (JSON) answer
    raw_body: bytes | None = None
    headers: dict = field(default_factory=dict)
    delay: float = 0.0
    finish_reason: str = "stop"     # "length": the answer was cut at max_tokens


def context_exceeded(n_ctx: int = 512, requested: int = 1800) -> StubReply:
    """The 400 an OpenAI-compatible server (llama-cpp-python's words) gives a prompt larger than its context."""
    return StubReply(400, content=f"This model's maximum context length is {n_ctx} tokens. However, you "
                                  f"requested {requested} tokens. Please reduce the length of the messages.")


def free_port() -> int:
    """A loopback port nobody listens on (bound and released): requests to it are refused, until a server (a
    test's own, to show that the same command then finishes) starts on it."""
    with refused_port() as port:
        return port


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port held bound but not listening: connecting is refused, and no other process (tests of
    other worktrees run at the same time) can take the port meanwhile."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@contextlib.contextmanager
def unanswered_port() -> Iterator[int]:
    """A loopback port whose connections are never set up: it listens with a backlog of one that a connection
    nobody accepts already fills, so the kernel drops every further handshake, as a dead host does, and a
    client waits out its connect timeout."""
    import socket

    with socket.socket() as sock, socket.socket() as filler:
        sock.bind(("127.0.0.1", 0))
        sock.listen(0)
        filler.connect(sock.getsockname())
        yield sock.getsockname()[1]


def _tokens(text: str) -> int:
    return len(text) // 4 + 1


def _messages_text(body: dict) -> str:
    parts = []
    for m in body.get("messages") or []:
        c = m.get("content")
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(str(p.get("text", "")) for p in c if isinstance(p, dict))
    return "\n".join(parts)


def hash_vector(text: str, dim: int = EMBED_DIM) -> list[float]:
    """Deterministic unit vector from a hash of the text (same text, same vector)."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    raw = [(digest[i % len(digest)] - 127.5) / 127.5 for i in range(dim)]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


def default_chat(body: dict) -> str:
    return "ok"


def wants_schema(body: dict) -> dict | None:
    """The JSON schema a chat request asks its answer to follow, in OpenAI's form (response_format json_schema)
    or llama-cpp-python's (json_object with a schema); None when it asks for none."""
    rf = body.get("response_format")
    if not isinstance(rf, dict):
        return None
    if rf.get("type") == "json_schema":
        return (rf.get("json_schema") or {}).get("schema") or {}
    if rf.get("type") == "json_object":
        return rf.get("schema") or {}
    return None


D = "<|#|>"   # the delimited format's field separator


def passage_of(body: dict) -> str:
    """The chunk text inside an extraction request (our prompt puts it after 'Passage:')."""
    for m in body["messages"]:
        if m["role"] == "user" and "Passage:\n" in m["content"]:
            return m["content"].split("Passage:\n", 1)[1].rsplit("\n\nOutput:", 1)[0]
    return ""


def is_gleaning(body: dict) -> bool:
    return body["messages"][-1]["role"] == "user" and len(body["messages"]) > 2


def fake_extraction(body: dict, limit: int = 12) -> str | dict:
    """Capitalised words of the passage become entities; each is related to the next one (a JSON object when
    the request asks for a schema)."""
    if is_gleaning(body):
        return {"entities": [], "relations": []} if wants_schema(body) is not None else "<|COMPLETE|>"
    words = []
    for w in re.findall(r"\b[A-Z][a-z]{3,}\b", passage_of(body)):
        if w not in words:
            words.append(w)
    words = words[:limit]
    if wants_schema(body) is not None:
        return {"entities": [{"name": w, "type": "concept", "description": f"{w} is mentioned in the passage."}
                             for w in words],
                "relations": [{"source": a, "target": b, "predicate": "appears with", "keywords": "co-occurrence",
                               "description": f"{a} and {b} appear together.", "strength": 5}
                              for a, b in zip(words, words[1:])]}
    rows = [f"entity{D}{w}{D}concept{D}{w} is mentioned in the passage." for w in words]
    rows += [f"relation{D}{a}{D}{b}{D}appears with{D}co-occurrence{D}{a} and {b} appear together.{D}5"
             for a, b in zip(words, words[1:])]
    return "\n".join(rows + ["<|COMPLETE|>"])


def citing(*numbers: int) -> Callable[[dict], str]:
    """A chat responder for retrieval-augmented answers: one sentence per number, in the order given (repeats
    and numbers the prompt does not hold included), each quoting the first words of the prompt's passage
    marked `[n]` at the start of a line and citing it as `[n]`."""
    def respond(body: dict) -> str:
        text = _messages_text(body)
        sentences = []
        for n in numbers:
            marker = f"[{n}]"
            line = next((ln for ln in text.splitlines() if ln.startswith(marker)), None)
            words = " ".join(line[len(marker):].split()[:6]) if line else "no such passage"
            sentences.append(f"{words} {marker}.")
        return " ".join(sentences)

    return respond


def default_rerank(body: dict) -> list[float]:
    """Score of each document: the fraction of the query's words it contains (a crude but real relevance)."""
    words = {w for w in str(body.get("query", "")).lower().split() if w}
    docs = [d if isinstance(d, str) else str(d.get("text", "")) for d in body.get("documents") or []]
    return [len(words & set(d.lower().split())) / (len(words) or 1) for d in docs]


def default_embed(body: dict) -> list[list[float]]:
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    return [hash_vector(str(x)) for x in inputs or []]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # benchmarks open many connections at once; the default backlog of 5 drops them
    allow_reuse_address = True


def _route(path: str) -> str | None:
    path = path.split("?", 1)[0].rstrip("/")
    if path.startswith("/v1/"):
        path = path[3:]
    return path if path in (CHAT, EMBED, RERANK) else None


class StubServer:
    """The server plus its script and request log; every public method is thread-safe."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, record: bool = True) -> None:
        self._lock = threading.Lock()
        self._record = record
        self.requests: list[tuple[str, dict]] = []
        self._queues: dict[str, deque[StubReply]] = {CHAT: deque(), EMBED: deque(), RERANK: deque()}
        self._chat: Callable[[dict], Any] = default_chat
        self._embed: Callable[[dict], Any] = default_embed
        self._rerank: Callable[[dict], Any] = default_rerank
        self.in_flight = 0
        self.max_in_flight = 0
        # response_format types this server takes; another gets the error llama-cpp-python's server gives
        self.json_shapes: set[str] = {"json_schema", "json_object"}
        self._httpd = _Server((host, port), _make_handler(self))
        self.host, self.port = self._httpd.server_address[:2]
        self._thread: threading.Thread | None = None

    # -- life cycle -------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> "StubServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"stub-server-{self.port}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "StubServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scripting ----------------------------------------------------------------------------------------
    def set_chat(self, fn: Callable[[dict], Any]) -> None:
        with self._lock:
            self._chat = fn

    def set_embed(self, fn: Callable[[dict], Any]) -> None:
        with self._lock:
            self._embed = fn

    def set_rerank(self, fn: Callable[[dict], Any]) -> None:
        """fn(body) -> one relevance score per document, in order."""
        with self._lock:
            self._rerank = fn

    def enqueue(self, path: str, *replies: StubReply) -> None:
        route = _route(path)
        if route is None:
            raise ValueError(f"stub has no route {path!r}")
        with self._lock:
            self._queues[route].extend(replies)

    def reset(self) -> None:
        """Back to defaults: no scripts, empty log, in-flight maximum cleared."""
        with self._lock:
            self.requests.clear()
            for q in self._queues.values():
                q.clear()
            self._chat = default_chat
            self._embed = default_embed
            self._rerank = default_rerank
            self.max_in_flight = self.in_flight

    def count(self, path: str = CHAT) -> int:
        route = _route(path)
        with self._lock:
            return sum(1 for p, _ in self.requests if p == route)

    # -- serving (called from handler threads) ------------------------------------------------------------
    def _begin(self, route: str, body: dict) -> tuple[StubReply | None, Callable[[dict], Any]]:
        with self._lock:
            if self._record:
                self.requests.append((route, body))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            queued = self._queues[route].popleft() if self._queues[route] else None
            return queued, {CHAT: self._chat, EMBED: self._embed, RERANK: self._rerank}[route]

    def _end(self) -> None:
        with self._lock:
            self.in_flight -= 1


def _chat_body(body: dict, text: str, finish_reason: str = "stop") -> dict:
    prompt = _tokens(_messages_text(body))
    completion = _tokens(text)
    return {
        "id": "chatcmpl-stub-" + hashlib.sha1(f"{time.time_ns()}".encode()).hexdigest()[:12],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "stub-model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def _encode(vector: list[float], fmt: str | None) -> list[float] | str:
    """The OpenAI SDK asks for base64 (little-endian float32) unless told otherwise; answer in kind."""
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def _embed_body(body: dict, vectors: list[list[float]]) -> dict:
    fmt = body.get("encoding_format")
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    prompt = sum(_tokens(str(x)) for x in inputs or [])
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": _encode(v, fmt)}
                 for i, v in enumerate(vectors)],
        "model": body.get("model", "stub-embed"),
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def _rerank_body(body: dict, scores: list[float]) -> dict:
    """Cohere-style: results best first, each with the document's index and relevance_score."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    top_n = body.get("top_n")
    if isinstance(top_n, int) and top_n > 0:
        order = order[:top_n]
    return {"id": "rerank-stub-" + hashlib.sha1(f"{time.time_ns()}".encode()).hexdigest()[:12],
            "results": [{"index": i, "relevance_score": scores[i]} for i in order],
            "meta": {"billed_units": {"search_units": 1}}}


def _error_body(status: int, message: str | None) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}.get(status,
                                                                                                      "server_error")
    return {"error": {"message": message or _REASONS.get(status, "error"), "type": kind, "param": None,
                      "code": None}}


def _make_handler(server: StubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence per-request logging
            return

        def _send(self, status: int, payload: bytes, headers: dict | None = None) -> None:
            try:
                self.send_response(status, _REASONS.get(status))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(str(k), str(v))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout); nothing to do

        def do_GET(self) -> None:  # noqa: N802
            self._send(404, json.dumps(_error_body(404, "not found")).encode())

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            route = _route(self.path)
            if route is None:
                self._send(404, json.dumps(_error_body(404, f"no route {self.path}")).encode())
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._send(400, json.dumps(_error_body(400, "request body is not JSON")).encode())
                return
            rf = body.get("response_format") if route == CHAT else None
            if isinstance(rf, dict) and rf.get("type") not in server.json_shapes:
                shapes = " or ".join(sorted(server.json_shapes))
                self._send(500, json.dumps(_error_body(500, "1 validation error: {'type': 'literal_error', 'loc': "
                                                            f"('body', 'response_format', 'type'), 'msg': 'Input should be "
                                                            f"{shapes}'}}")).encode())
                return
            queued, responder = server._begin(route, body)
            try:
                reply = queued
                if reply is None:
                    try:
                        result = responder(body)
                    except Exception as exc:  # a broken test responder shows up as a 500, not a hang
                        result = StubReply(status=500, content=f"stub responder failed: {exc!r}")
                    reply = result if isinstance(result, StubReply) else None
                    if reply is None:
                        if route == CHAT:   # a dict or list is a structured answer: sent as its JSON text
                            reply = StubReply(content=result if isinstance(result, str) else json.dumps(result))
                        else:
                            make = _embed_body if route == EMBED else _rerank_body
                            reply = StubReply(raw_body=json.dumps(make(body, result)).encode())
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.raw_body is not None:
                    payload = reply.raw_body
                elif reply.status != 200:
                    payload = json.dumps(_error_body(reply.status, reply.content)).encode()
                elif route == CHAT:
                    text = reply.content if reply.content is not None else "ok"
                    text = text if isinstance(text, str) else json.dumps(text)   # a structured answer
                    payload = json.dumps(_chat_body(body, text, reply.finish_reason)).encode()
                elif route == RERANK:
                    scores = default_rerank(body) if reply.content is None else json.loads(reply.content)
                    payload = json.dumps(_rerank_body(body, scores)).encode()
                else:
                    vectors = default_embed(body) if reply.content is None else json.loads(reply.content)
                    payload = json.dumps(_embed_body(body, vectors)).encode()
                self._send(reply.status, payload, reply.headers)
            finally:
                server._end()

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="OpenAI-compatible stub server (instant replies) for benchmarks")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    args = parser.parse_args(argv)
    # Benchmarks send many requests: keep no request log so memory stays flat.
    stub = StubServer(args.host, args.port, record=False)
    print(f"stub server listening on {stub.url}", flush=True)
    try:
        stub._httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        stub._httpd.server_close()


if __name__ == "__main__":
    main()


def stub_settings(stub: "StubServer", *, llm_model: str | None = None, embed_model: str | None = None,
                  retries: int = 1, section: str = "", **values: Any):
    """Settings that reach the stub through litellm, with quick retries; `values` set fields of `section`."""
    from hrag_cli.core.config import Settings

    s = Settings()
    if llm_model:
        s.llm.model, s.llm.api_base = llm_model, stub.url
    if embed_model:
        s.embed.model, s.embed.api_base = embed_model, stub.url
    s.llm.max_retries, s.llm.backoff_base = retries, 0.01
    for key, value in values.items():
        setattr(getattr(s, section), key, value)
    return s
