"""The one litellm client: async calls with a bounded number in flight, retries with backoff, a persistent
response cache, and per-run usage/cost with a spend limit.

Every response lands in cache/llm.jsonl keyed by a hash of the request (model, messages, temperature,
max_tokens; not api_base, so the same model through another proxy reuses it), which is what makes an
interrupted or repeated run free: an identical request is never sent twice. litellm is imported lazily,
after `offline.setup()`, so importing this module costs nothing and needs no network.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from hrag_cli.core import interrupt, store
from hrag_cli.core.config import LLMSettings
from hrag_cli.core.errors import BudgetExceeded, UsageError
from hrag_cli.core.llm_retry import (_MISSING_KEY, LLMError, _status, failure_cause, is_local, is_run_level,
                                     with_retries)
from hrag_cli.core.openai_http import OpenAIHTTP, ServerError, api_key, uses_http
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, fingerprint

T = TypeVar("T")

_litellm: Any = None


def import_litellm() -> Any:
    """litellm, imported once, offline, quiet (a cron log must not fill with its debug chatter) and with its
    hidden retries off: every retry is ours (with_retries), so counts, backoff and Retry-After stay in one
    place. Embedding code gets litellm from here too."""
    global _litellm
    if _litellm is None:
        from hrag_cli.core import offline

        offline.setup()
        import litellm

        litellm.suppress_debug_info = True
        # litellm leaves these coroutines behind when a connection fails; the failure itself is reported
        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                message=r"coroutine '(OpenAIChatCompletion|BaseLLMHTTPHandler)\..*' was never awaited")
        # litellm's openai embedding path turns max_retries=0 into this default (`max_retries or DEFAULT`)
        litellm.DEFAULT_MAX_RETRIES = 0
        litellm.num_retries = 0
        litellm.set_verbose = False
        for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm", "httpx", "httpcore", "openai"):
            logging.getLogger(name).setLevel(logging.ERROR)
        _litellm = litellm
    return _litellm




# -- settings for the server at hand ---------------------------------------------------------------------------
REMOTE_TIMEOUT, REMOTE_CONCURRENCY = 120.0, 8
LOCAL_TIMEOUT, LOCAL_CONCURRENCY = 600.0, 1


_DEFAULT_PORTS = {"ollama": 11434, "ollama_chat": 11434}


def supports_schema(settings: LLMSettings) -> bool:
    """Whether this provider can be made to answer within a JSON schema: an OpenAI-compatible server
    (llama.cpp, vLLM, Ollama's /v1, LM Studio take response_format; LLMClient falls back to llama-cpp-python's
    form), Ollama (its `format`), or a hosted model litellm's model list says supports a response schema."""
    if uses_http(settings.model, settings.api_base):
        return True
    if settings.model.split("/", 1)[0] in ("ollama", "ollama_chat"):
        return True
    try:
        return bool(import_litellm().supports_response_schema(model=settings.model))
    except Exception:
        return False


def probe_local(settings: LLMSettings) -> None:
    """Raise ConnectionRefusedError when nothing listens at a server on this machine (one TCP connect, no
    request): the retry policy then stops at once."""
    import socket
    from urllib.parse import urlsplit

    if settings.api_base:
        parts = urlsplit(settings.api_base if "//" in settings.api_base else "//" + settings.api_base)
        host = parts.hostname or "127.0.0.1"
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return
    else:
        host, port = "127.0.0.1", _DEFAULT_PORTS.get(settings.model.split("/", 1)[0], 0)
        if not port:
            return
    try:
        socket.create_connection((host, port), timeout=2.0).close()
    except ConnectionRefusedError:
        raise ConnectionRefusedError(f"Connection refused: nothing listens at {host}:{port}") from None
    except OSError:
        return      # anything else (a slow accept): the request itself will say


def effective_settings(settings: LLMSettings) -> LLMSettings:
    """`settings` with timeout and concurrency 0 (auto) filled in for this server: a local server computes one
    answer at a time, so more in flight only queue up and time out while it keeps working for them."""
    local = is_local(settings)
    return replace(settings,
                   timeout=settings.timeout or (LOCAL_TIMEOUT if local else REMOTE_TIMEOUT),
                   concurrency=settings.concurrency or (LOCAL_CONCURRENCY if local else REMOTE_CONCURRENCY))


# -- the client ----------------------------------------------------------------------------------------------
@dataclass
class LLMResponse:
    text: str
    key: str
    cached: bool
    prompt_tokens: int
    completion_tokens: int
    cost: float
    finish_reason: str = ""     # "stop", "length" (cut at max_tokens), "" when the provider did not say


@dataclass
class LLMStats:
    """This run's numbers (cache hits cost nothing and are not in tokens/cost)."""

    requests: int = 0           # requests answered by the network
    cache_hits: int = 0         # answered from cache/llm.jsonl or by an identical request already in flight
    retries: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class _LoopState:
    """What must belong to one event loop: the semaphore, the futures of requests in flight, and the pooled
    HTTP client of an OpenAI-compatible server (openai_http)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, concurrency: int) -> None:
        self.loop = loop
        self.sem = asyncio.Semaphore(max(1, concurrency))
        self.inflight: dict[str, asyncio.Future] = {}
        self.http: OpenAIHTTP | None = None


class LLMClient:
    """Chat completions through litellm with caching, bounded concurrency, retries and a spend limit.

    `cache_path` is cache/llm.jsonl (indexing) unless given: queries keep theirs in cache/query_llm.jsonl
    (query_client), so a query never touches what the index was built from."""

    def __init__(self, project: ProjectDir, settings: LLMSettings, *, max_cost: float | None = None,
                 reporter: Reporter | None = None, cache_path: Path | None = None,
                 connect_timeout: float | None = None) -> None:
        self.project = project
        self.settings = effective_settings(settings)
        self.connect_timeout = connect_timeout     # seconds to open a connection; None: settings.timeout
        self.down: LLMError | None = None          # set by a fail-fast client after a run-level failure
        self.max_cost = max_cost
        self.reporter = reporter
        self.stats = LLMStats()
        self.enabled = bool(settings.model)
        self.cache_path = cache_path or project.llm_cache_path
        if self.enabled and reporter is not None and is_local(settings) and not (settings.timeout
                                                                                 and settings.concurrency):
            reporter.info(f"LLM server on this machine: {self.settings.concurrency} request(s) at a time, "
                          f"{self.settings.timeout:g} s timeout ([llm] concurrency and timeout change this)")
        self._cache: dict[str, dict] = {}
        for rec in store.read_jsonl(self.cache_path):
            if isinstance(rec, dict) and isinstance(rec.get("key"), str) and isinstance(rec.get("response"), str):
                self._cache[rec["key"]] = rec
        self._appender: store.JsonlAppender | None = None
        self._write_lock = threading.Lock()
        self._state: _LoopState | None = None
        self.direct = uses_http(self.settings.model, self.settings.api_base)
        self._shape = "json_schema"    # how response_format carries a schema; see _response_format
        self._probed = False

    # -- keys and cache ----------------------------------------------------------------------------------
    def _max_tokens(self, max_tokens: int | None) -> int:
        return int(max_tokens) if max_tokens is not None else int(self.settings.max_tokens)

    def request_key(self, messages: list[dict], *, max_tokens: int | None = None, schema: dict | None = None) -> str:
        """Hash of everything that shapes the answer; api_base is left out on purpose (same model, any proxy)."""
        extra = () if schema is None else (schema,)
        return fingerprint("chat", self.settings.model, messages, float(self.settings.temperature),
                           self._max_tokens(max_tokens), *extra)

    def cached(self, key: str) -> dict | None:
        return self._cache.get(key)

    def _store(self, record: dict) -> None:
        with self._write_lock:
            if self._appender is None:
                self._appender = store.JsonlAppender(self.cache_path, exclusive=self.project.holds_lock)
            self._appender.append(record)
            self._cache[record["key"]] = record

    def close(self) -> None:
        with self._write_lock:
            if self._appender is not None:
                self._appender.close()
                self._appender = None

    def __enter__(self) -> "LLMClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls ---------------------------------------------------------------------------------------------
    def request_timeout(self) -> Any:
        return request_timeout(self.settings.timeout, self.connect_timeout)

    def _loop_state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        if self._state is None or self._state.loop is not loop:
            self._state = _LoopState(loop, self.settings.concurrency)
        return self._state

    def _check_budget(self) -> None:
        if self.max_cost is not None and self.stats.cost >= self.max_cost:
            raise BudgetExceeded(f"LLM spend this run reached ${self.stats.cost:.4f} (--max-cost "
                                 f"{self.max_cost:g}); what is done so far is saved, run again to continue")

    async def achat(self, messages: list[dict], *, max_tokens: int | None = None, purpose: str = "",
                    schema: dict | None = None) -> LLMResponse:
        """One chat completion; from the cache when this exact request was answered before. `schema`: a JSON
        schema the answer must follow (structured output), for a provider that supports one."""
        if not self.enabled:
            raise UsageError("no LLM model configured: set [llm] model in hrag.toml, $HRAG_LLM_MODEL or --llm-model")
        key = self.request_key(messages, max_tokens=max_tokens, schema=schema)
        state = self._loop_state()
        while True:
            hit = self._cache.get(key)
            if hit is not None:
                self.stats.cache_hits += 1
                return _from_record(hit, cached=True)
            pending = state.inflight.get(key)
            if pending is None:
                break
            # the same request is already on the wire: wait for it instead of paying twice
            await asyncio.wait({pending})
            if pending.cancelled():
                continue  # its caller was cancelled, not us: try again (from cache, or send it ourselves)
            exc = pending.exception()
            if exc is not None:
                raise exc
            self.stats.cache_hits += 1
            return _from_record(pending.result(), cached=True)
        fut: asyncio.Future = state.loop.create_future()
        state.inflight[key] = fut
        try:
            rec = await self._fetch(key, messages, self._max_tokens(max_tokens), purpose, state, schema)
        except BaseException as exc:
            if not fut.done():
                if isinstance(exc, Exception):
                    fut.set_exception(exc)
                    fut.exception()  # mark retrieved: nobody may be waiting on it
                else:
                    fut.cancel()
            raise
        finally:
            state.inflight.pop(key, None)
        if not fut.done():
            fut.set_result(rec)
        return _from_record(rec, cached=False)

    def _response_format(self, schema: dict) -> dict:
        """OpenAI's structured-output request (vLLM, llama.cpp's llama-server, Ollama's /v1 take it too); after
        a server refused that shape, llama-cpp-python's: a JSON object constrained by `schema`."""
        if self._shape == "json_object":
            return {"type": "json_object", "schema": schema}
        return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}

    def _refused_shape(self, exc: BaseException) -> bool:
        """An error status about response_format's json_schema shape (llama-cpp-python's server answers 500 to
        a request it cannot validate): try the other shape once."""
        text = f"{getattr(exc, 'message', '')} {exc}"
        if self._shape != "json_schema" or _status(exc) not in (400, 422, 500):
            return False
        if "response_format" in text or "json_schema" in text:
            self._shape = "json_object"
            return True
        return False

    async def _fetch(self, key: str, messages: list[dict], max_tokens: int, purpose: str,
                     state: _LoopState, schema: dict | None = None) -> dict:
        self._check_budget()
        s = self.settings
        text, finish, prompt_tokens, completion_tokens, cost = await self._answer(messages, max_tokens, state, schema)
        rec = {"key": key, "model": s.model, "messages_hash": fingerprint(messages), "purpose": purpose,
               "response": text, "finish_reason": finish, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
               "cost": cost, "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._store(rec)
        self.stats.requests += 1
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens
        self.stats.cost += cost
        return rec

    async def _answer(self, messages: list[dict], max_tokens: int, state: _LoopState,
                      schema: dict | None) -> tuple[str, str, int, int, float]:
        """One request through the shared retry policy: (text, finish reason, prompt and completion tokens,
        cost). The one place a request leaves this process (cluster.ray_llm sends it from another node)."""
        if self.direct:
            return await self._fetch_http(messages, max_tokens, state, schema)
        return await self._fetch_litellm(messages, max_tokens, state, schema)

    async def _fetch_http(self, messages: list[dict], max_tokens: int, state: _LoopState,
                          schema: dict | None) -> tuple[str, str, int, int, float]:
        """An OpenAI-compatible server, through openai_http (no litellm per call)."""
        s = self.settings
        if state.http is None:
            state.http = OpenAIHTTP(s.api_base, api_key(is_local(s)), s.timeout, self.connect_timeout)
        http = state.http
        body: dict[str, Any] = {"model": s.model.split("/", 1)[1], "messages": messages,
                                "temperature": s.temperature, "max_tokens": max_tokens}

        async def once() -> Any:
            if not http.headers.get("authorization"):
                # as litellm says it for a remote OpenAI-compatible API without a key, before sending anything
                raise ServerError(None, f"{_MISSING_KEY}: set OPENAI_API_KEY for {s.api_base}")
            if schema is not None:
                body["response_format"] = self._response_format(schema)
            try:
                return await asyncio.wait_for(http.chat(body), timeout=s.timeout + 5.0)
            except ServerError as exc:
                if schema is None or not self._refused_shape(exc):
                    raise
            body["response_format"] = self._response_format(schema)
            return await asyncio.wait_for(http.chat(body), timeout=s.timeout + 5.0)

        data = await self._send(once, state)
        choice = data["choices"][0] if isinstance(data["choices"][0], dict) else {}
        content = (choice.get("message") or {}).get("content")
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt_tokens = int(usage.get("prompt_tokens", 0) or 0)
        completion_tokens = int(usage.get("completion_tokens", 0) or 0)
        # a priced model (openai/gpt-4o-mini behind a proxy) costs what litellm's local price list says
        cost = 0.0 if s.model in _unpriced else _cost(import_litellm(), None, s.model, prompt_tokens,
                                                      completion_tokens)
        return (content if isinstance(content, str) else ""), str(choice.get("finish_reason") or ""), \
            prompt_tokens, completion_tokens, cost

    async def _fetch_litellm(self, messages: list[dict], max_tokens: int, state: _LoopState,
                             schema: dict | None) -> tuple[str, str, int, int, float]:
        s = self.settings
        kwargs: dict[str, Any] = {"model": s.model, "messages": messages, "temperature": s.temperature,
                                  "max_tokens": max_tokens, "timeout": self.request_timeout(), "num_retries": 0,
                                  "max_retries": 0}
        if schema is not None:
            # litellm turns this into each provider's own form (Ollama's `format`, Gemini's response schema)
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        if s.api_base:
            kwargs["api_base"] = s.api_base
            if s.model.startswith("openai/") and is_local(s) and not os.environ.get("OPENAI_API_KEY"):
                kwargs["api_key"] = "no-key"   # a server on this machine needs none; the SDK insists on one

        async def once() -> Any:
            if not self._probed and is_local(s):
                probe_local(s)      # a refused connection is said before litellm's seconds of importing
                self._probed = True
            # a hard stop a little past the request timeout, for providers that do not honour it
            return await asyncio.wait_for(import_litellm().acompletion(**kwargs), timeout=s.timeout + 5.0)

        resp = await self._send(once, state)
        litellm = import_litellm()
        text, finish = _response_text(resp)
        usage = getattr(resp, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        return text, finish, prompt_tokens, completion_tokens, _cost(litellm, resp, s.model, prompt_tokens,
                                                                     completion_tokens)

    async def _send(self, once: Callable[[], Awaitable[Any]], state: _LoopState) -> Any:
        """One request with the shared retry policy, counted in stats. The slot is held through backoff sleeps
        too: under a 429 storm the whole client slows down instead of queued requests rushing in to be
        refused as well."""
        def count_retry() -> None:
            self.stats.retries += 1

        async with state.sem:
            self._check_budget()  # the spend may have reached the limit while this request waited for a slot
            if self.down is not None:
                raise self.down   # a fail-fast client does not knock on a door that was just shut
            try:
                return await with_retries(once, self.settings, self.reporter, what=self.settings.model,
                                          on_retry=count_retry)
            except LLMError as exc:
                self.stats.failures += 1
                if self.connect_timeout is not None and is_run_level(exc):
                    self.down = exc
                raise

    def rerank_key(self, query: str, document: str) -> str:
        return fingerprint("rerank", self.settings.model, query, document)

    async def arerank(self, query: str, documents: list[str], *, purpose: str = "rerank") -> list[float]:
        """Relevance of each document to the query from a litellm rerank model (cohere-style /rerank), one
        score per document in order. Cached per (model, query, document), so only documents never scored for
        this query are sent, in one request."""
        if not self.enabled:
            raise UsageError("no rerank model configured: pass --rerank MODEL")
        keys = [self.rerank_key(query, d) for d in documents]
        missing = list(dict.fromkeys(i for i, k in enumerate(keys) if k not in self._cache))
        if missing:
            await self._fetch_rerank(query, [documents[i] for i in missing], [keys[i] for i in missing], purpose)
        else:
            self.stats.cache_hits += 1
        return [float(self._cache[k]["response"]) for k in keys]

    async def _fetch_rerank(self, query: str, documents: list[str], keys: list[str], purpose: str) -> None:
        self._check_budget()
        litellm = import_litellm()
        s = self.settings
        kwargs: dict[str, Any] = {"model": s.model, "query": query, "documents": documents,
                                  "top_n": len(documents), "timeout": self.request_timeout(), "num_retries": 0}
        if s.api_base:
            kwargs["api_base"] = s.api_base

        async def once() -> Any:
            return await asyncio.wait_for(litellm.arerank(**kwargs), timeout=s.timeout + 5.0)

        resp = await self._send(once, self._loop_state())
        scores: dict[int, float] = {}
        for item in getattr(resp, "results", None) or []:
            get = item.get if isinstance(item, dict) else (lambda name, _i=item: getattr(_i, name, None))
            idx, score = get("index"), get("relevance_score")
            if isinstance(idx, int) and 0 <= idx < len(documents) and isinstance(score, (int, float)):
                scores[idx] = float(score)
        if len(scores) != len(documents):
            self.stats.failures += 1
            raise LLMError(f"rerank model {s.model} scored {len(scores)} of {len(documents)} documents")
        hidden = getattr(resp, "_hidden_params", None) or {}
        cost = float(hidden.get("response_cost") or 0.0) if isinstance(hidden, dict) else 0.0
        ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for i, key in enumerate(keys):
            self._store({"key": key, "model": s.model, "purpose": purpose, "response": repr(scores[i]),
                         "usage": {}, "cost": cost / len(keys), "ts": ts})
        self.stats.requests += 1
        self.stats.cost += cost

    def rerank(self, query: str, documents: list[str], **kw: Any) -> list[float]:
        """Synchronous arerank."""
        return self._run_sync(lambda: self.arerank(query, documents, **kw))

    def chat(self, messages: list[dict], **kw: Any) -> LLMResponse:
        """Synchronous convenience; runs achat in its own event loop (in a thread if one is already running)."""
        return self._run_sync(lambda: self.achat(messages, **kw))

    async def aclose(self) -> None:
        """Close the HTTP connections of the running event loop (before it ends)."""
        state = self._state
        if state is not None and state.http is not None:
            http, state.http = state.http, None
            await http.aclose()

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """asyncio.run(make()) that closes this client's HTTP connections before its event loop ends, and that
        SIGINT or SIGTERM stop at once (core.interrupt: requests in flight are abandoned, not waited for)."""
        async def main() -> T:
            try:
                return await make()
            finally:
                await self.aclose()

        return interrupt.run(main)

    def _run_sync(self, make: Callable[[], Awaitable[T]]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self.run(make)
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["r"] = self.run(make)
            except BaseException as exc:  # handed back to the caller's thread
                box["e"] = exc

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join()
        if "e" in box:
            raise box["e"]
        return box["r"]


def _from_record(rec: dict, *, cached: bool) -> LLMResponse:
    usage = rec.get("usage") or {}
    return LLMResponse(text=rec.get("response", ""), key=rec["key"], cached=cached,
                       prompt_tokens=int(usage.get("prompt_tokens", 0) or 0),
                       completion_tokens=int(usage.get("completion_tokens", 0) or 0),
                       cost=0.0 if cached else float(rec.get("cost", 0.0) or 0.0),
                       finish_reason=str(rec.get("finish_reason") or ""))


def _response_text(resp: Any) -> tuple[str, str]:
    """The answer's text and its finish_reason ("length" means it was cut at max_tokens)."""
    try:
        choice = resp.choices[0]
        content = choice.message.content
    except (AttributeError, IndexError, KeyError, TypeError):
        raise LLMError("LLM response had no choices") from None
    finish = getattr(choice, "finish_reason", None)
    return (content if isinstance(content, str) else ""), (str(finish) if finish else "")


_unpriced: set[str] = set()


def _cost(litellm: Any, resp: Any, model: str, prompt_tokens: int, completion_tokens: int) -> float:
    """litellm's price for this response from its local cost map; 0 for a model it does not know (asking again
    for an unknown model costs milliseconds per call, so the answer is remembered)."""
    hidden = getattr(resp, "_hidden_params", None) or {}
    known = hidden.get("response_cost") if isinstance(hidden, dict) else None
    if isinstance(known, (int, float)) and known >= 0:
        return float(known)  # litellm already priced it while logging the call
    if model in _unpriced:
        return 0.0
    if resp is not None:
        try:
            return float(litellm.completion_cost(completion_response=resp, model=model) or 0.0)
        except Exception:
            pass
    try:
        p, c = litellm.cost_per_token(model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        return float(p + c)
    except Exception:
        _unpriced.add(model)
        return 0.0


QUERY_CONNECT_TIMEOUT = 3.0     # seconds: a query must not wait on a server that is not there


def request_timeout(seconds: float, connect: float | None) -> Any:
    """litellm's timeout for a request (chat, rerank, embedding): seconds, or an httpx.Timeout with a short
    connect phase for a fail-fast query-time caller (litellm reduces it to its read part for providers that
    take only seconds)."""
    if connect is None:
        return seconds
    import httpx   # a dependency of litellm, there once litellm is

    return httpx.Timeout(seconds, connect=min(connect, seconds))


def query_client(project: ProjectDir, settings: LLMSettings) -> LLMClient:
    """The client for query-time calls (keywords, answers, filters): its own cache file, so `hrag query`
    never appends to cache/llm.jsonl. It fails fast: one attempt (no retries, no backoff), a short connect
    timeout, and after a failure every other request of the run would meet too (no server, bad key), no
    further attempts; the caller falls back (keywords: the query text) with one line from failure_note."""
    return LLMClient(project, replace(settings, max_retries=0), cache_path=project.query_llm_cache_path,
                     connect_timeout=QUERY_CONNECT_TIMEOUT)


def failure_note(exc: BaseException, settings: LLMSettings) -> str:
    """One line for a query-time LLM failure: the cause in the user's terms and, when known, the fix."""
    cause = failure_cause(exc, settings)
    if cause is None:
        return str(exc)
    return f"{cause.explain(exc)}; to use the LLM, {cause.remedy}"


def spend_summary(project: ProjectDir, path: Path | None = None) -> dict:
    """Totals over every response ever stored in cache/llm.jsonl, or `path` (what the project has cost)."""
    n = prompt = completion = 0
    cost = 0.0
    for rec in store.read_jsonl(path or project.llm_cache_path):
        if not isinstance(rec, dict):
            continue
        usage = rec.get("usage") or {}
        n += 1
        prompt += int(usage.get("prompt_tokens", 0) or 0)
        completion += int(usage.get("completion_tokens", 0) or 0)
        cost += float(rec.get("cost", 0.0) or 0.0)
    return {"responses": n, "prompt_tokens": prompt, "completion_tokens": completion, "cost": cost}
