"""Chat completions sent straight to an OpenAI-compatible server (llama.cpp, vLLM, Ollama's /v1, LM Studio, a
proxy): one pooled aiohttp session per event loop (a dependency of litellm; a request costs a fraction of what
it costs through httpx), the body encoded with orjson, the answer read as a dict.

LLMClient uses this for `openai/MODEL` with an api_base, and litellm for every other provider. litellm's own
per-call work (its logging, cost and response objects) costs several times what the rest of a chunk costs
hrag (docs/benchmarks.md), and an OpenAI-compatible server needs none of it. Errors keep the shape the retry
policy reads: `status_code`, `message` and the response headers (Retry-After), aiohttp's own errors for a
refused connection, asyncio.TimeoutError for a request that took too long, ConnectionError for a connection
that could not be opened in time.
"""

from __future__ import annotations

import os
from typing import Any

import orjson


class ServerError(Exception):
    """The server answered with an error status (or a body that is no chat completion)."""

    def __init__(self, status_code: int | None, message: str, headers: Any = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.headers = headers

    def __reduce__(self) -> tuple:
        # pickled whole (a Ray worker hands it back to the driver): the default would call __init__(message)
        return (ServerError, (self.status_code, self.message, dict(self.headers) if self.headers else None))


def uses_http(model: str, api_base: str) -> bool:
    """Whether LLMClient talks to this model itself: an OpenAI-compatible server at a known address."""
    return bool(api_base) and model.startswith("openai/")


def api_key(local: bool) -> str:
    """The bearer key: $OPENAI_API_KEY as litellm would send it, or a placeholder for a server on this machine
    (it needs none; some servers still expect the header)."""
    return os.environ.get("OPENAI_API_KEY") or ("no-key" if local else "")


def _error_message(body: bytes) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode("utf-8", errors="replace").strip()
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        return str(err)[:500]
    return str(data)[:500]


class OpenAIHTTP:
    """POST /chat/completions to `api_base`; `timeout`: seconds per request, `connect`: seconds to connect."""

    def __init__(self, api_base: str, key: str, timeout: float, connect: float | None = None) -> None:
        self.url = api_base.rstrip("/") + "/chat/completions"
        self.headers = {"content-type": "application/json", "accept": "application/json"}
        if key:
            self.headers["authorization"] = f"Bearer {key}"
        self.timeout, self.connect = timeout, connect
        self._client: Any = None

    def _http(self) -> Any:
        if self._client is None:
            import aiohttp

            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout, connect=min(self.connect or self.timeout,
                                                                              self.timeout)),
                connector=aiohttp.TCPConnector(limit=0))
        return self._client

    async def chat(self, body: dict) -> dict:
        """The server's answer as a dict; ServerError for an error status or an answer without choices."""
        import aiohttp

        try:
            async with self._http().post(self.url, data=orjson.dumps(body), headers=self.headers) as resp:
                status, content, headers = resp.status, await resp.read(), resp.headers
        except aiohttp.ConnectionTimeoutError:
            raise ConnectionError(f"could not connect to {self.url} within {self.connect or self.timeout:g} s") \
                from None
        if status >= 400:
            raise ServerError(status, _error_message(content), headers)
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            raise ServerError(502, f"the server's answer is not JSON: {content[:200]!r}") from None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
            if isinstance(data, dict) and data.get("error"):
                raise ServerError(500, _error_message(content))
            raise ServerError(None, "LLM response had no choices")
        return data

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
