"""LLM requests sent from a Ray cluster's nodes, with one cap and one backoff for the whole cluster.

The driver's LLMClient stays the only one that decides and records: it holds the cluster-wide cap (its
semaphore: --concurrency requests in flight across every node), retries with the shared policy, pauses every
request when the provider pushes back (429), and appends each answer to cache/llm.jsonl the moment it
arrives, so a rerun after a killed driver asks nothing that was answered. Worker actors only send: one
attempt per call, the failure handed back to the driver whole. Actors restart on another node when theirs
dies, and Ray retries the calls they held, so a lost node costs only its requests in flight.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hrag_cli.core import llm
from hrag_cli.core.config import LLMSettings
from hrag_cli.core.llm import LLMClient, _LoopState
from hrag_cli.core.llm_retry import LLMError, _status, backoff_delay
from hrag_cli.core.openai_http import ServerError
from hrag_cli.core.project import ProjectDir

ACTORS_PER_NODE = 1     # senders per node: one event loop keeps hundreds of requests open


def forwarded_env() -> dict[str, str]:
    """Provider keys and endpoints the workers need and may not have (a node's raylet has its own
    environment): the *_API_KEY / *_API_BASE variables of the driver."""
    return {k: v for k, v in os.environ.items() if k.endswith(("_API_KEY", "_API_BASE", "_API_VERSION"))}


class Sender:
    """A Ray actor that sends requests: the single-process client's own code, one attempt, no cache."""

    def __init__(self, settings: LLMSettings) -> None:
        self.client = LLMClient(ProjectDir(Path(os.devnull)), replace(settings, max_retries=0),
                                cache_path=Path(os.devnull))
        if self.client.direct:
            llm._unpriced.add(settings.model)    # priced by the driver: no litellm import (seconds) per worker

    def ready(self) -> bool:
        return True

    async def ask(self, messages: list[dict], max_tokens: int, schema: dict | None) -> Any:
        """(text, finish reason, prompt tokens, completion tokens, cost), or the provider's error."""
        try:
            return await self.client._answer(messages, max_tokens, self.client._loop_state(), schema)
        except LLMError as exc:
            return portable(exc.__cause__ or exc)


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a ServerError with its status and text (what the retry policy
    reads)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return ServerError(_status(exc), str(exc) or type(exc).__name__)


class SenderPool:
    """The actors, each call to the one with the fewest requests in flight."""

    def __init__(self, ray: Any, settings: LLMSettings, n: int) -> None:
        actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=100_000,
                           runtime_env={"env_vars": forwarded_env()}, scheduling_strategy="SPREAD")(Sender)
        self.actors = [actor.remote(settings) for _ in range(max(1, n))]
        self.load = [0] * len(self.actors)
        ray.get([a.ready.remote() for a in self.actors])    # started before the first request: the cap is
                                                            # then reached at once, not actor by actor

    async def ask(self, messages: list[dict], max_tokens: int, schema: dict | None) -> Any:
        i = min(range(len(self.actors)), key=self.load.__getitem__)
        self.load[i] += 1
        try:
            return await self.actors[i].ask.remote(messages, max_tokens, schema)
        finally:
            self.load[i] -= 1


class ClusterLLMClient(LLMClient):
    """LLMClient whose requests leave from the cluster's nodes (see the module's docstring)."""

    def __init__(self, project: ProjectDir, settings: LLMSettings, pool_of: Any, **kw: Any) -> None:
        super().__init__(project, settings, **kw)
        # the driver prices each answer from litellm's local price list: imported while the senders start (a
        # wait on the cluster), not on the first answer, where its seconds would stall every request in flight
        pricing = threading.Thread(target=llm.import_litellm, daemon=True) \
            if self.direct and self.settings.model not in llm._unpriced else None
        if pricing is not None:
            pricing.start()
        self.pool: SenderPool = pool_of(self.settings)
        if pricing is not None:
            pricing.join()
        self._pause_until = 0.0

    async def _answer(self, messages: list[dict], max_tokens: int, state: _LoopState,
                      schema: dict | None) -> tuple[str, str, int, int, float]:
        async def once() -> Any:
            wait = self._pause_until - time.monotonic()
            if wait > 0:    # the provider pushed back: every request waits, not only the refused one
                await asyncio.sleep(wait)
            out = await self.pool.ask(messages, max_tokens, schema)
            if isinstance(out, BaseException):
                if _status(out) == 429:
                    self._pause_until = max(self._pause_until, time.monotonic() + backoff_delay(0, self.settings, out))
                raise out
            text, finish, prompt_tokens, completion_tokens, cost = out
            if self.direct and self.settings.model not in llm._unpriced:
                cost = llm._cost(llm.import_litellm(), None, self.settings.model, prompt_tokens, completion_tokens)
            return text, finish, prompt_tokens, completion_tokens, cost

        return await self._send(once, state)


def cluster_client(ray: Any, project: ProjectDir, settings: LLMSettings, nodes: int, **kw: Any) -> ClusterLLMClient:
    """The driver's client for a run on the cluster `ray` is connected to, with senders on its `nodes`."""
    return ClusterLLMClient(project, settings, lambda s: SenderPool(ray, s, nodes * ACTORS_PER_NODE), **kw)
