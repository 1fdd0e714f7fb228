"""LLM extraction on a Ray cluster's nodes, with one cap and one backoff for the whole cluster.

Sender actors (one per node) extract whole chunks: they build the prompts, send the requests with the shared
retry policy, parse the answers and hand back finished records, a batch of chunks per actor call, so the
driver only prices, counts and appends (records to cache/extractions.jsonl, answers to cache/llm.jsonl) and
its own cost per chunk stays small however many nodes send. The cap (--concurrency) is split into one share
per sender, each share a semaphore on its node, so the requests in flight across the cluster never pass it
and no request waits on a round trip for a permit; a sender the provider pushes back (429) tells a small
backoff actor, which pauses every sender, not only the refused one.

What is answered is never asked again: each sender journals every answer the moment it arrives
(cache/llm.journal/, on the shared storage), so an answer held by a sender when the driver dies, or by a
sender whose node is lost, is not lost with it. A restarted sender reads its own journal back (Ray retries
the batch it held, and what was answered comes from there); the next driver folds every journal left
behind into cache/llm.jsonl before it starts. A chunk whose first request was answered before (a run that
stopped mid-chunk) is extracted by the driver itself from those answers, its further rounds sent through
the senders one request at a time, as is a chunk whose first request another chunk of this run is already
asking (the same text twice).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import secrets
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hrag_cli.core import llm, store
from hrag_cli.core.config import ExtractSettings, LLMSettings
from hrag_cli.core.llm import LLMClient, LLMStats, _LoopState
from hrag_cli.core.llm_retry import LLMError, _status, backoff_delay
from hrag_cli.core.openai_http import ServerError
from hrag_cli.core.project import ProjectDir, fingerprint
from hrag_cli.core.records import Chunk, ExtractionRecord

ACTORS_PER_NODE = 1     # senders per node: one event loop keeps hundreds of requests open
BATCH_OF_SHARE = 4      # a batch is a quarter of a sender's share: few actor calls, records back soon
JOURNAL = "llm.journal"     # under cache/: the senders' answers, until the driver has them in llm.jsonl
COUNTED = ("requests", "cache_hits", "retries", "failures", "prompt_tokens", "completion_tokens", "cost")


def forwarded_env() -> dict[str, str]:
    """Provider keys and endpoints the workers need and may not have (a node's raylet has its own
    environment): the *_API_KEY / *_API_BASE variables of the driver."""
    return {k: v for k, v in os.environ.items() if k.endswith(("_API_KEY", "_API_BASE", "_API_VERSION"))}


def shares(cap: int, senders: int) -> list[int]:
    """The cap split over the senders, as evenly as it goes (every share at least 1: never more senders
    than the cap)."""
    n = max(1, min(cap, senders))
    return [cap // n + (i < cap % n) for i in range(n)]


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a ServerError with its status and text (what the retry policy
    reads)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return ServerError(_status(exc), str(exc) or type(exc).__name__)


@dataclass
class Failure:
    """Why a sender could not finish a chunk, fit to cross to the driver: an LLMError keeps its cause there
    (the failure kinds are read from it)."""

    error: BaseException
    llm_message: str | None = None      # set: the error was an LLMError with this text, `error` its cause

    @classmethod
    def of(cls, exc: BaseException) -> "Failure":
        if isinstance(exc, LLMError) and exc.__cause__ is not None:
            return cls(portable(exc.__cause__), str(exc))
        return cls(portable(exc))

    def raised(self) -> BaseException:
        if self.llm_message is None:
            return self.error
        exc = LLMError(self.llm_message)
        exc.__cause__ = self.error
        return exc


def _named(kind: str, run: str, i: int = 0) -> str:
    """A run's actors find each other by name (a restarted one too: handles are not constructor arguments,
    which Ray could not give a restarted actor again once they left the object store)."""
    return f"hrag-{kind}-{run}-{i}"


def _actor(name: str) -> Any:
    import ray

    return ray.get_actor(name)


class Backoff:
    """A Ray actor: the one pause of the whole cluster. A sender pushed back tells it; it tells every sender."""

    def __init__(self, run: str, senders: int) -> None:
        self.names = [_named("sender", run, i) for i in range(senders)]

    def pushed_back(self, seconds: float) -> None:
        for name in self.names:
            try:
                _actor(name).pause.remote(seconds)
            except ValueError:      # not started yet, or restarting: it keeps its own pause
                pass


class _NodeClient(LLMClient):
    """The single-process client's own code on a sender: its requests take a slot of the sender's share and
    wait out the cluster's pause before every attempt; fresh answers are kept for the driver."""

    def __init__(self, sender: "Sender", settings: LLMSettings, cache_path: Path) -> None:
        super().__init__(ProjectDir(Path(os.devnull)), settings, cache_path=cache_path)
        self.sender = sender
        self.fresh: list[dict] = []

    def _loop_state(self) -> _LoopState:
        state = super()._loop_state()
        state.sem = self.sender.slots()
        return state

    def _store(self, record: dict) -> None:
        super()._store(record)
        self.fresh.append(record)

    async def _send(self, once: Any, state: _LoopState) -> Any:
        sender = self.sender

        async def paced() -> Any:
            wait = sender.pause_until - time.monotonic()
            if wait > 0:    # the provider pushed back (here or on another node): every request waits
                await asyncio.sleep(wait)
            try:
                return await once()
            except Exception as exc:
                if _status(exc) == 429:
                    sender.pushed_back(backoff_delay(0, self.settings, exc))
                raise

        return await super()._send(paced, state)


class Sender:
    """A Ray actor that extracts chunks (extract_batch) and sends single requests for the driver (ask), both
    within its share of the cap."""

    def __init__(self, settings: LLMSettings, share: int, journal: str, run: str) -> None:
        self.share = max(1, share)
        self.settings = replace(settings, concurrency=self.share)
        self.backoff = _named("backoff", run)
        self.pause_until = 0.0
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        # a restarted sender opens its predecessor's journal: what it answered is a cache hit, not a request
        self.client = _NodeClient(self, self.settings, Path(journal))
        self.once = _NodeClient(self, replace(self.settings, max_retries=0), Path(os.devnull))
        for c in (self.client, self.once):
            if c.direct:
                llm._unpriced.add(settings.model)    # priced by the driver: no litellm import (seconds) here

    def ready(self, extract_chunk: Any = None) -> bool:
        """Started, with the extraction code imported (unpickling the function imports its module): every
        sender's first requests then leave together."""
        return True

    def slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.share))
        return self._slots[1]

    def pause(self, seconds: float) -> None:
        self.pause_until = max(self.pause_until, time.monotonic() + seconds)

    def pushed_back(self, seconds: float) -> None:
        self.pause(seconds)
        try:
            _actor(self.backoff).pushed_back.remote(seconds)
        except ValueError:      # the backoff actor is restarting: this sender still waits
            pass

    async def ask(self, messages: list[dict], max_tokens: int, schema: dict | None) -> Any:
        """One request, one attempt (the driver retries): (text, finish reason, prompt tokens, completion
        tokens, cost), or the provider's error."""
        try:
            return await self.once._answer(messages, max_tokens, self.once._loop_state(), schema)
        except LLMError as exc:
            return portable(exc.__cause__ or exc)

    async def extract_batch(self, extract_chunk: Any, extract: ExtractSettings, extractor: str,
                            items: list[tuple[Chunk, dict]]) -> tuple[list[Any], list[dict], dict]:
        """Each chunk extracted (llm_extractor.extract_chunk with its attempt arguments): per chunk its record
        as JSON or the error that stopped it; then the answers received since the last batch (for
        cache/llm.jsonl) and the usage counted since."""
        async def one(chunk: Chunk, kw: dict) -> Any:
            try:
                return (await extract_chunk(self.client, chunk, extract, extractor, **kw)).to_json()
            except Exception as exc:
                return Failure.of(exc)

        out = await asyncio.gather(*(one(ch, kw) for ch, kw in items))
        fresh, self.client.fresh = self.client.fresh, []
        stats, self.client.stats = self.client.stats, LLMStats()
        return list(out), fresh, stats.as_dict()


class SenderPool:
    """The backoff actor and the senders, one share of the cap each."""

    def __init__(self, ray: Any, settings: LLMSettings, n: int, journal_dir: Path, warm: Any = None) -> None:
        env = {"env_vars": forwarded_env()}
        run = secrets.token_hex(4)
        self.shares = shares(settings.concurrency, n)
        self.backoff = ray.remote(num_cpus=0, max_restarts=-1, runtime_env=env)(Backoff).options(
            name=_named("backoff", run)).remote(run, len(self.shares))
        actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=100_000,
                           runtime_env=env, scheduling_strategy="SPREAD")(Sender)
        self.actors = [actor.options(name=_named("sender", run, i)).remote(
            settings, share, str(journal_dir / f"{run}-{i}.jsonl"), run) for i, share in enumerate(self.shares)]
        self.load = [0] * len(self.actors)
        ray.get([a.ready.remote(warm) for a in self.actors])    # started before the first request: the cap is
                                                            # then reached at once, not actor by actor
        self.ray = ray

    async def ask(self, messages: list[dict], max_tokens: int, schema: dict | None) -> Any:
        i = min(range(len(self.actors)), key=lambda j: self.load[j] / self.shares[j])
        self.load[i] += 1
        try:
            return await self.actors[i].ask.remote(messages, max_tokens, schema)
        finally:
            self.load[i] -= 1

    def close(self) -> None:
        """Stop the senders (a batch still running after a stopped run journals nothing more)."""
        for a in [*self.actors, self.backoff]:
            try:
                self.ray.kill(a, no_restart=True)
            except Exception:
                pass


class ClusterLLMClient(LLMClient):
    """LLMClient whose chunks are extracted on the cluster's nodes (see the module's docstring)."""

    def __init__(self, project: ProjectDir, settings: LLMSettings, ray: Any, nodes: int, *,
                 extract_chunk: Any = None, first_request: Any = None, **kw: Any) -> None:
        super().__init__(project, settings, **kw)
        # llm_extractor's functions, from the extract stage (this package sits below it)
        self._extract_chunk, self._first_request = extract_chunk, first_request
        self.journal_dir = project.root / "cache" / JOURNAL
        self.fold_journals()
        # with nothing answered before this run, no chunk's first request can be in the cache but a twin's
        self._asked_before = bool(self._cache)
        # the driver prices each answer from litellm's local price list: imported while the senders start (a
        # wait on the cluster), not on the first answer, where its seconds would stall every request in flight
        pricing = threading.Thread(target=llm.import_litellm, daemon=True) \
            if self.direct and self.settings.model not in llm._unpriced else None
        if pricing is not None:
            pricing.start()
        self.pool = SenderPool(ray, self.settings, nodes * ACTORS_PER_NODE, self.journal_dir, extract_chunk)
        if pricing is not None:
            pricing.join()
        self._pause_until = 0.0
        self._queue: list[tuple[Chunk, ExtractSettings, str, dict, asyncio.Future]] = []
        self._asking: dict[str, asyncio.Future] = {}    # (text, attempt) -> its chunk's record, this run
        self._kick_due = False
        self._abandoned = False     # a batch was left running (a stopped run): its sender may still journal

    # -- answers the senders journaled ----------------------------------------------------------------------
    def fold_journals(self, remove: bool = True) -> None:
        """Every answer a sender journaled and this cache lacks, appended to it; then the journals go, unless
        a sender may still be writing one (`remove` False: the next run folds it again)."""
        if not self.journal_dir.is_dir():
            return
        paths = sorted(self.journal_dir.glob("*.jsonl"))
        for path in paths:
            for rec in store.read_jsonl(path):
                if isinstance(rec, dict) and isinstance(rec.get("key"), str) and rec["key"] not in self._cache \
                        and isinstance(rec.get("response"), str):
                    self._store(rec)
        if remove:
            for path in paths:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """The senders stopped, and what they journaled (a restarted sender's answers from its predecessor
        never came back in a batch) in cache/llm.jsonl."""
        pool, self.pool = getattr(self, "pool", None), None
        if pool is not None:
            pool.close()
            self.fold_journals(remove=not self._abandoned)
        super().close()

    # -- chunks on the nodes --------------------------------------------------------------------------------
    async def extract_chunk(self, chunk: Chunk, settings: ExtractSettings, extractor: str, **kw: Any) -> Any:
        """What llm_extractor.extract_chunk(self, chunk, ...) returns, extracted by a sender; a chunk asked
        before (answers in the cache), or whose first request another chunk is asking now, is extracted here
        from the answers instead."""
        attempt = kw.get("attempt", 1)
        key = fingerprint(chunk.text, attempt)      # the same text and attempt: the same first request
        twin = self._asking.get(key)
        if twin is not None:
            await asyncio.wait({twin})
        if twin is not None or (self._asked_before and self._first_key(chunk, settings, attempt) in self._cache):
            return await self._extract_chunk(self, chunk, settings, extractor, **kw)
        self._check_budget()
        fut = asyncio.get_running_loop().create_future()
        self._asking[key] = fut
        try:
            self._queue.append((chunk, settings, extractor, kw, fut))
            self._kick()
            out = await fut
        finally:
            self._asking.pop(key, None)
        return ExtractionRecord.from_json(out)

    def _first_key(self, chunk: Chunk, settings: ExtractSettings, attempt: int) -> str:
        """The cache key of a chunk's first request (building its prompt: with hints, a rules extraction)."""
        _, messages, budget, schema = self._first_request(chunk, settings, self.settings, attempt)
        return self.request_key(messages, max_tokens=budget, schema=schema)

    def _kick(self) -> None:
        """Send what is queued once the chunks started in this turn of the loop are all in (batches)."""
        if not self._kick_due:
            self._kick_due = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._kick_due = False
        self._abandoned = False     # a batch was left running (a stopped run): its sender may still journal
        pool = self.pool
        while self._queue:
            # the sender with the most of its share free; each holds at most a share on the wire and one queued
            i = max(range(len(pool.shares)), key=lambda j: pool.shares[j] - pool.load[j])
            room = 2 * pool.shares[i] - pool.load[i]
            if room <= 0:
                return
            size = min(room, max(1, pool.shares[i] // BATCH_OF_SHARE), len(self._queue))
            batch, self._queue = self._queue[:size], self._queue[size:]
            batch = [b for b in batch if not b[-1].done()]    # cancelled while queued: a stopping run
            if batch:
                pool.load[i] += len(batch)
                asyncio.ensure_future(self._send_batch(i, batch))

    async def _send_batch(self, i: int, batch: list[tuple[Chunk, ExtractSettings, str, dict, asyncio.Future]]
                          ) -> None:
        """One actor call for a batch of chunks (of one extract setting and extractor: those of the run)."""
        _, settings, extractor, _, _ = batch[0]
        pool = self.pool
        try:
            try:
                results, fresh, stats = await pool.actors[i].extract_batch.remote(
                    self._extract_chunk, settings, extractor, [(c, kw) for c, _, _, kw, _ in batch])
            except asyncio.CancelledError:
                self._abandoned = True
                raise
            except Exception as exc:      # the actor could not run it at all (the cluster is going away)
                results, fresh, stats = [Failure(exc)] * len(batch), [], {}
            self._take(fresh, stats)
            for (*_, fut), res in zip(batch, results):
                if fut.done():
                    continue
                if isinstance(res, Failure):
                    fut.set_exception(res.raised())
                else:
                    fut.set_result(res)
        finally:
            pool.load[i] -= len(batch)
            if self._queue:
                self._kick()

    def _take(self, fresh: list[dict], stats: dict) -> None:
        """A batch's answers into cache/llm.jsonl (priced here) and its usage into this run's counts."""
        cost = 0.0
        for rec in fresh:
            if self.direct and self.settings.model not in llm._unpriced:
                usage = rec.get("usage") or {}
                rec = {**rec, "cost": llm._cost(llm.import_litellm(), None, self.settings.model,
                                                 int(usage.get("prompt_tokens", 0) or 0),
                                                 int(usage.get("completion_tokens", 0) or 0))}
            cost += float(rec.get("cost") or 0.0)
            if rec["key"] not in self._cache:
                self._store(rec)
        for name in COUNTED:
            if name != "cost":
                setattr(self.stats, name, getattr(self.stats, name) + int(stats.get(name, 0) or 0))
        self.stats.cost += cost

    # -- single requests, for the chunks the driver extracts ---------------------------------------------------
    async def _answer(self, messages: list[dict], max_tokens: int, state: _LoopState,
                      schema: dict | None) -> tuple[str, str, int, int, float]:
        async def once() -> Any:
            wait = self._pause_until - time.monotonic()
            if wait > 0:    # the provider pushed back: every request waits, not only the refused one
                await asyncio.sleep(wait)
            out = await self.pool.ask(messages, max_tokens, schema)
            if isinstance(out, BaseException):
                if _status(out) == 429:
                    delay = backoff_delay(0, self.settings, out)
                    self._pause_until = max(self._pause_until, time.monotonic() + delay)
                    self.pool.backoff.pushed_back.remote(delay)
                raise out
            text, finish, prompt_tokens, completion_tokens, cost = out
            if self.direct and self.settings.model not in llm._unpriced:
                cost = llm._cost(llm.import_litellm(), None, self.settings.model, prompt_tokens, completion_tokens)
            return text, finish, prompt_tokens, completion_tokens, cost

        return await self._send(once, state)


def cluster_client(ray: Any, project: ProjectDir, settings: LLMSettings, nodes: int, **kw: Any) -> ClusterLLMClient:
    """The driver's client for a run on the cluster `ray` is connected to, with senders on its `nodes`."""
    return ClusterLLMClient(project, settings, ray, nodes, **kw)
