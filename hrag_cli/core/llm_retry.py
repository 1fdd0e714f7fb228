"""Why an LLM request failed and whether to try again: the one retry policy (which errors are transient, the
backoff, Retry-After) and the failure causes a run reports with their fixes. Shared by the LLM client and the
embedders that call providers through litellm."""

from __future__ import annotations

import asyncio
import email.utils
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar

from hrag_cli.core.config import LLMSettings
from hrag_cli.core.errors import BudgetExceeded, HragError
from hrag_cli.core.openai_http import ServerError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.redact import scrub

T = TypeVar("T")

_RETRY_STATUSES = {408, 409, 425, 429}  # plus every 5xx
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "ip6-localhost"}


class LLMError(HragError):
    """An LLM (or embedding) request failed for good: retries exhausted, or the provider refused it."""


# -- the shared retry policy -------------------------------------------------------------------------------
def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    if code is None:
        code = getattr(getattr(exc, "response", None), "status_code", None)
    try:
        return int(code) if code is not None else None
    except (TypeError, ValueError):
        return None


def _is_provider_error(exc: BaseException) -> bool:
    """Errors raised by the HTTP stack (litellm, openai, httpx, aiohttp), as opposed to bugs in our code."""
    if isinstance(exc, (asyncio.TimeoutError, ConnectionError, TimeoutError, ServerError)):
        return True
    return any(c.__module__.split(".")[0] in ("litellm", "openai", "httpx", "httpcore", "aiohttp")
               for c in type(exc).__mro__)


def _is_timeout_or_connection(exc: BaseException) -> bool:
    if isinstance(exc, (asyncio.TimeoutError, ConnectionError, TimeoutError)):
        return True
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"Timeout", "APITimeoutError", "APIConnectionError", "TimeoutException",
                         "TransportError", "ClientConnectionError", "ServerDisconnectedError"})


_TIMEOUT_NAMES = {"Timeout", "APITimeoutError", "ReadTimeout", "WriteTimeout", "PoolTimeout"}


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or type(exc).__name__ in _TIMEOUT_NAMES


def is_connection_failure(exc: BaseException) -> bool:
    """No connection could be made (refused, reset, no route, DNS, connect timeout), as opposed to a request
    that was sent and then timed out or got an error status."""
    if _is_timeout(exc) or _status(exc) not in (None, 500):
        return False
    if _is_timeout_or_connection(exc):
        return True
    return describe_error(exc).startswith("connection failed")


def is_retryable(exc: BaseException) -> bool:
    """Rate limits, timeouts, connection errors and 5xx are worth another try; other 4xx never succeed."""
    status = _status(exc)
    if _is_timeout_or_connection(exc):
        # litellm gives connection errors status 500 and timeouts 408: both transient
        return True
    if status is None:
        return False
    if status == 429 and ("insufficient_quota" in str(getattr(exc, "body", "") or "")
                          or "exceeded your current quota" in str(exc)):
        return False  # OpenAI's "you have no credit" is a 429 that no amount of waiting fixes
    if _MISSING_KEY in str(exc):
        return False  # litellm reports a missing API key as a 500; waiting does not add one
    return status in _RETRY_STATUSES or status >= 500


_MISSING_KEY = "Missing credentials"
_REFUSED_MARKS = ("Cannot connect to host", "Connect call failed", "Connection refused")
_CONTEXT_RE = re.compile(r"context (?:length|window|size)|maximum context|exceeds? (?:the )?(?:model'?s? )?context"
                         r"|n_ctx|too many tokens|prompt is too long", re.IGNORECASE)


# What to do about each kind of failure (FailureCause.kind); every line ends with AGAIN.
FIXES = {
    "provider": "prefix the model with its provider, e.g. --llm-model openai/{model} for an OpenAI-compatible "
                "server at --llm-api-base",
    "auth": "set the provider's key variable (e.g. OPENAI_API_KEY)",
    "quota": "add credit or use another key",
    "model": "check --llm-model and --llm-api-base",
    "context": "give the server a larger context (llama.cpp --n_ctx 4096 or more, Ollama num_ctx) or lower "
               "--chunk-tokens",
    "timeout": "raise [llm] timeout or lower --concurrency (a server on this machine answers one request at "
               "a time)",
    "connection": "start the server, or correct --llm-api-base",
    "server": "check the LLM server's log",
}
AGAIN = "then run the same command again"


@dataclass(frozen=True)
class FailureCause:
    """Why a request failed, in terms of what the user can do about it.

    `run_level`: every other request of the run would fail the same way (no server, unknown provider, bad or
    missing key, unknown model, no quota), so one occurrence stops the run. The other kinds (context too
    small, timeouts, server errors) can be one chunk's own problem; the extract stage stops when several
    chunks in a row fail for the same one."""

    kind: str          # a key of FIXES
    run_level: bool
    what: str          # the cause, as the user reads it
    model: str = ""

    @property
    def remedy(self) -> str:
        """What to do about it, e.g. 'start the server, or correct --llm-api-base'."""
        return FIXES[self.kind].format(model=self.model or "NAME")

    @property
    def fix(self) -> str:
        return f"{self.remedy}, {AGAIN}"

    def explain(self, exc: BaseException) -> str:
        """The cause with the provider's own words, e.g. 'cannot reach the LLM at URL (connection failed)'."""
        root = exc.__cause__ if isinstance(exc, LLMError) and exc.__cause__ is not None else exc
        detail = "LLM Provider NOT provided" if self.kind == "provider" else describe_error(root)
        return f"{self.what} ({detail})"


def failure_cause(exc: BaseException, settings: LLMSettings) -> FailureCause | None:
    """The cause behind an LLMError (or a raw provider error); None for a request's own problem (a 400 about
    its content) and for our own bugs."""
    err = exc.__cause__ if isinstance(exc, LLMError) and exc.__cause__ is not None else exc
    text = f"{getattr(err, 'message', '')} {err}"
    status = _status(err)
    where = settings.api_base or "the provider's default endpoint"
    if "LLM Provider NOT provided" in text:
        return FailureCause("provider", True, f"litellm does not know which provider serves '{settings.model}'",
                            settings.model)
    if _MISSING_KEY in text:
        return FailureCause("auth", True, f"no API key for {settings.model} at {where}")
    if status in (401, 403):
        return FailureCause("auth", True, f"{where} refused the API key")
    if status == 429 and not is_retryable(err):
        return FailureCause("quota", True, "the provider says the account has no quota left")
    if status == 404:
        return FailureCause("model", True, f"{where} does not serve the model '{settings.model}'")
    if _CONTEXT_RE.search(text) or type(err).__name__ == "ContextWindowExceededError":
        return FailureCause("context", False, "the model's context window is too small for a chunk plus the "
                            "extraction prompt")
    if _is_timeout(err):
        return FailureCause("timeout", False, f"requests to {where} timed out after {settings.timeout:g} s")
    if _is_timeout_or_connection(err) or describe_error(err).startswith("connection failed"):
        return FailureCause("connection", True, f"cannot reach the LLM at {where}")
    if status is not None and status >= 500:
        return FailureCause("server", False, f"the LLM at {where} keeps failing")
    return None


def is_run_level(exc: BaseException) -> bool:
    """A failure every other request of the run would meet too (no server, unknown provider, bad or missing
    key, unknown model, no quota left), as opposed to one request's own problem: the run should stop."""
    cause = failure_cause(exc, LLMSettings())
    return cause is not None and cause.run_level


def _headers(exc: BaseException) -> Any:
    """Where the provider's response headers live on a litellm exception: litellm re-creates `exc.response`
    without them, but keeps the originals in `exc.litellm_response_headers` (an httpx.Headers)."""
    for h in (getattr(exc, "litellm_response_headers", None), getattr(exc, "headers", None),
              getattr(getattr(exc, "response", None), "headers", None)):
        if h:
            return h
    return None


def retry_after(exc: BaseException, now: float | None = None) -> float | None:
    """Seconds the provider asked us to wait (Retry-After as seconds or an HTTP date, or retry-after-ms)."""
    headers = _headers(exc)
    if not headers:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = str(value).strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def describe_error(exc: BaseException) -> str:
    """One line: status and reason, plus the provider's own message when it says more."""
    status = _status(exc)
    name = type(exc).__name__
    if _is_timeout(exc):
        return "timed out"
    raw = scrub(str(getattr(exc, "message", "") or exc)).replace("\n", " ").strip()   # stored and printed
    detail = raw.rsplit("Exception - ", 1)[-1].strip() if "Exception - " in raw else raw
    if detail.lower().startswith("connection error"):
        return "connection failed"  # litellm reports a refused/reset connection as a 500 "Connection error."
    if any(m in detail for m in _REFUSED_MARKS):
        return "connection failed"  # aiohttp's refusal, which litellm passes on as a 500  # litellm reports a refused/reset connection as a 500 "Connection error."
    if name == "ConnectError":
        return "connection failed"
    if name == "APIConnectionError" or (status is None and _is_timeout_or_connection(exc)):
        return f"connection failed ({detail[:160]})" if detail else "connection failed"
    if status is None:
        return f"{name}: {detail[:200]}"
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    head = f"{status} {phrase}".strip()
    if detail and detail.lower() != phrase.lower():
        return f"{head} ({detail[:200]})"
    return head


def backoff_delay(attempt: int, settings: LLMSettings, exc: BaseException | None = None) -> float:
    """Full jitter: uniform(0, min(cap, base * 2**attempt)); a provider's Retry-After wins, capped too."""
    cap = max(0.0, settings.backoff_max)
    if exc is not None:
        asked = retry_after(exc)
        if asked is not None:
            return min(asked, cap)
    return random.uniform(0.0, min(cap, settings.backoff_base * (2 ** attempt)))


async def with_retries(call: Callable[[], Awaitable[T]], settings: LLMSettings, reporter: Reporter | None = None,
                       *, what: str | None = None, on_retry: Callable[[], None] | None = None) -> T:
    """Run `call` until it succeeds, retrying transient failures up to settings.max_retries times.

    Raises LLMError naming `what` (default: settings.model) and the last status when it finally fails, or at
    once for a non-retryable provider error (authentication, bad request). Our own bugs propagate unchanged.
    `on_retry` is called before each retry (the client counts them in its stats).
    """
    label = what if what is not None else settings.model
    attempt = 0
    while True:
        try:
            return await call()
        except (BudgetExceeded, asyncio.CancelledError):
            raise
        except Exception as exc:
            if not _is_provider_error(exc):
                raise
            if not is_retryable(exc):
                raise LLMError(f"LLM request rejected: {label}: {describe_error(exc)}") from exc
            unreachable = is_connection_failure(exc)
            limit = settings.max_retries
            if unreachable:
                # nothing listens on this machine's port: waiting will not start the server. A remote host
                # may be restarting or behind a flaky network: a few quick tries, not minutes of backoff.
                limit = 0 if is_local(settings) else min(limit, CONNECT_RETRIES)
            if attempt >= limit:
                raise LLMError(f"LLM request failed after {attempt} retries: {label}: "
                               f"{describe_error(exc)}") from exc
            delay = backoff_delay(attempt, settings, exc)
            if unreachable:
                delay = min(delay, CONNECT_BACKOFF_MAX)
            attempt += 1
            if reporter is not None:
                reporter.info(f"{label}: {describe_error(exc)}; retry {attempt}/{settings.max_retries} "
                              f"in {delay:.1f}s")
            if on_retry is not None:
                on_retry()
            await asyncio.sleep(delay)


CONNECT_RETRIES = 2          # retries of a remote server that cannot be reached
CONNECT_BACKOFF_MAX = 2.0    # seconds between them at most


def is_local(settings: LLMSettings) -> bool:
    """A server on this machine: a loopback api_base, or Ollama with its default one."""
    if not settings.api_base:
        return settings.model.startswith(("ollama/", "ollama_chat/"))
    from urllib.parse import urlsplit

    host = (urlsplit(settings.api_base if "//" in settings.api_base else "//" + settings.api_base).hostname or "")
    return host.lower() in _LOOPBACK or host.startswith("127.")
