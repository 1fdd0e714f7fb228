"""The LLM client through the real litellm against the local stub server: cache, retries, limits, secrets."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from hrag_cli.core.config import LLMSettings
from hrag_cli.core.errors import BudgetExceeded, UsageError
from hrag_cli.core.llm import LLMClient, spend_summary
from hrag_cli.core.llm_retry import LLMError, is_run_level, retry_after, with_retries
from hrag_cli.core.project import ProjectDir
from tests.stub_server import CHAT, StubReply

MSG = [{"role": "user", "content": "Name one river."}]


@pytest.fixture
def project(tmp_path: Path) -> ProjectDir:
    p = ProjectDir(tmp_path / "proj")
    p.init()
    return p


def settings(stub, **kw) -> LLMSettings:
    base = dict(model="openai/stub-model", api_base=stub.url, backoff_base=0.01, backoff_max=5.0,
                max_retries=3, timeout=5.0, concurrency=4)
    base.update(kw)
    return LLMSettings(**base)


def test_success_returns_text_usage_and_zero_cost_for_unknown_model(stub, project):
    stub.set_chat(lambda body: "The Danube.")
    with LLMClient(project, settings(stub)) as client:
        r = client.chat(MSG)
    assert r.text == "The Danube." and not r.cached
    assert r.prompt_tokens > 0 and r.completion_tokens > 0
    assert r.cost == 0.0
    assert client.stats.requests == 1 and client.stats.cost == 0.0
    path, body = stub.requests[0]
    assert path == CHAT and body["messages"] == MSG and body["temperature"] == 0.0
    rec = next(iter(orjson.loads(line) for line in project.llm_cache_path.read_bytes().splitlines()))
    assert set(rec) >= {"key", "model", "messages_hash", "response", "usage", "cost", "ts"}
    assert rec["response"] == "The Danube." and rec["key"] == r.key


def test_identical_request_is_served_from_cache_even_by_a_new_client(stub, project):
    with LLMClient(project, settings(stub)) as client:
        first = client.chat(MSG)
        again = client.chat(MSG)
        assert again.cached and again.text == first.text and stub.count() == 1
        assert client.stats.cache_hits == 1
        other = client.chat(MSG, max_tokens=7)  # a different request parameter is a different request
        assert not other.cached and stub.count() == 2
    # a new client (a later run) and a different proxy for the same model still reuse the cache
    with LLMClient(project, settings(stub, api_base=stub.url.replace("127.0.0.1", "localhost"))) as client:
        assert client.cached(first.key) is not None
        assert client.chat(MSG).cached
    assert stub.count() == 2
    # another model is another request
    with LLMClient(project, settings(stub, model="openai/other-model")) as client:
        assert not client.chat(MSG).cached
    assert stub.count() == 3


def test_concurrent_identical_requests_share_one_call(stub, project):
    stub.set_chat(lambda body: StubReply(content="shared", delay=0.2))

    async def go(client):
        return await asyncio.gather(*(client.achat(MSG) for _ in range(5)))

    with LLMClient(project, settings(stub)) as client:
        results = asyncio.run(go(client))
    assert [r.text for r in results] == ["shared"] * 5
    assert stub.count() == 1
    assert sum(not r.cached for r in results) == 1


def test_429_retry_after_is_honoured(stub, project):
    stub.enqueue(CHAT, StubReply(429, headers={"Retry-After": "1"}))
    with LLMClient(project, settings(stub)) as client:
        t0 = time.monotonic()
        r = client.chat(MSG)
        waited = time.monotonic() - t0
    assert r.text == "ok"
    assert stub.count() == 2 and client.stats.retries == 1
    assert waited >= 0.95


def test_500_then_success(stub, project):
    stub.enqueue(CHAT, StubReply(500), StubReply(503))
    with LLMClient(project, settings(stub)) as client:
        assert client.chat(MSG).text == "ok"
    assert stub.count() == 3 and client.stats.retries == 2


def test_400_fails_at_once_without_retry(stub, project):
    stub.enqueue(CHAT, StubReply(400, content="unsupported parameter"))
    with LLMClient(project, settings(stub)) as client:
        with pytest.raises(LLMError) as info:
            client.chat(MSG)
    assert stub.count() == 1
    msg = str(info.value)
    assert "openai/stub-model" in msg and "400" in msg and "\n" not in msg
    assert not project.llm_cache_path.exists() or project.llm_cache_path.read_bytes() == b""


def test_401_fails_at_once(stub, project):
    stub.enqueue(CHAT, StubReply(401, content="invalid api key"))
    with LLMClient(project, settings(stub)) as client:
        with pytest.raises(LLMError, match="401"):
            client.chat(MSG)
    assert stub.count() == 1


def test_quota_exhausted_429_is_not_retried(stub, project):
    body = {"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                      "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}
    stub.enqueue(CHAT, StubReply(429, raw_body=orjson.dumps(body)))
    with LLMClient(project, settings(stub)) as client:
        with pytest.raises(LLMError, match="rejected: openai/stub-model: 429 Too Many Requests .*quota"):
            client.chat(MSG)
    assert stub.count() == 1


def test_run_level_refusals_are_told_apart_from_one_request_problems(stub, project):
    body = {"error": {"message": "You exceeded your current quota.", "type": "insufficient_quota",
                      "code": "insufficient_quota"}}
    replies = {"key": StubReply(401, content="invalid api key"), "quota": StubReply(429, raw_body=orjson.dumps(body)),
               "bad request": StubReply(400, content="context length exceeded"),
               "server": StubReply(500, content="boom")}
    verdicts = {}
    with LLMClient(project, settings(stub, max_retries=0)) as client:
        for i, (name, reply) in enumerate(replies.items()):
            stub.enqueue(CHAT, reply)
            with pytest.raises(LLMError) as info:
                client.chat([{"role": "user", "content": f"question {i}"}])
            verdicts[name] = is_run_level(info.value)
    assert verdicts == {"key": True, "quota": True, "bad request": False, "server": False}


def test_malformed_body_is_retried_then_fails_with_one_line(stub, project):
    stub.set_chat(lambda body: StubReply(raw_body=b"{not json"))
    with LLMClient(project, settings(stub, max_retries=2)) as client:
        with pytest.raises(LLMError) as info:
            client.chat(MSG)
    assert stub.count() == 3
    assert str(info.value).startswith("LLM request failed after 2 retries: openai/stub-model:")
    assert client.stats.failures == 1


def test_persistent_503_message_names_model_and_status(stub, project):
    stub.set_chat(lambda body: StubReply(503))
    with LLMClient(project, settings(stub, max_retries=1)) as client:
        with pytest.raises(LLMError, match=r"^LLM request failed after 1 retries: openai/stub-model: 503 Service "
                                           r"Unavailable$"):
            client.chat(MSG)


def test_timeout_is_retried(stub, project):
    """The first request for MSG is held until the test lets it go: only the client's own timeout can end it,
    so an answer while it is still held proves the timeout cut it off, however slow the machine (no upper
    bound on time; a loaded machine may need more than one retry)."""
    release = threading.Event()
    held: list[dict] = []

    def respond(body):
        if body["messages"] == MSG and not held:
            held.append(body)
            release.wait(30)         # held; a client that never gives up gets "late" after 30 s and fails below
            return "late"
        return "ok"

    stub.set_chat(respond)
    try:
        with LLMClient(project, settings(stub, timeout=1.0, max_retries=5)) as client:
            client.chat([{"role": "user", "content": "warm up"}])   # litellm's first call costs seconds: not timed
            t0 = time.monotonic()
            r = client.chat(MSG)
            waited = time.monotonic() - t0
        assert r.text == "ok" and held and not release.is_set()   # answered by a retry while the first was held
        assert client.stats.retries >= 1 and 3 <= stub.count() <= client.stats.retries + 2
        assert waited >= 0.95        # it did wait out the timeout first
    finally:
        release.set()


def test_concurrency_is_bounded(stub, project):
    stub.set_chat(lambda body: StubReply(content="x", delay=0.15))

    async def go(client):
        return await asyncio.gather(*(client.achat([{"role": "user", "content": f"q{i}"}]) for i in range(8)))

    with LLMClient(project, settings(stub, concurrency=2)) as client:
        results = asyncio.run(go(client))
    assert len(results) == 8 and stub.count() == 8
    assert stub.max_in_flight == 2


def test_max_cost_stops_new_requests(stub, project):
    # gpt-4o-mini is in litellm's local price list, so the stub's usage turns into a real cost
    s = settings(stub, model="openai/gpt-4o-mini")
    with LLMClient(project, s, max_cost=1e-9) as client:
        r = client.chat(MSG)
        assert r.cost > 0 and client.stats.cost == r.cost
        with pytest.raises(BudgetExceeded):
            client.chat([{"role": "user", "content": "another"}])
        assert client.chat(MSG).cached  # cache hits are free and still served
    assert stub.count() == 1
    summary = spend_summary(project)
    assert summary["responses"] == 1 and summary["cost"] == pytest.approx(r.cost)
    assert summary["prompt_tokens"] == r.prompt_tokens and summary["completion_tokens"] == r.completion_tokens


def test_in_flight_requests_finish_when_budget_is_reached(stub, project):
    stub.set_chat(lambda body: StubReply(content="x", delay=0.1))
    s = settings(stub, model="openai/gpt-4o-mini", concurrency=2)

    async def go(client):
        return await asyncio.gather(*(client.achat([{"role": "user", "content": f"q{i}"}]) for i in range(6)),
                                    return_exceptions=True)

    with LLMClient(project, s, max_cost=1e-9) as client:
        results = asyncio.run(go(client))
    done = [r for r in results if not isinstance(r, BaseException)]
    assert len(done) == 2 and all(isinstance(r, BudgetExceeded) for r in results if r not in done)
    assert stub.count() == 2 and spend_summary(project)["responses"] == 2


def test_api_key_is_never_written(stub, project, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-123")
    stub.enqueue(CHAT, StubReply(500), StubReply(content="fine"))
    with LLMClient(project, settings(stub, model="openai/gpt-4o-mini")) as client:
        client.chat(MSG)
        stub.enqueue(CHAT, StubReply(400, content="bad"))
        with pytest.raises(LLMError) as info:
            client.chat([{"role": "user", "content": "other"}])
    assert "sk-secret-123" not in str(info.value)
    # the key did reach the provider (so the test is real) ...
    assert stub.count() == 3
    # ... and nowhere on disk
    files = [f for f in project.root.rglob("*") if f.is_file()]
    assert project.llm_cache_path in files
    for f in files:
        assert b"sk-secret-123" not in f.read_bytes(), f


def test_torn_last_line_in_cache_is_tolerated(stub, project):
    with LLMClient(project, settings(stub)) as client:
        first = client.chat(MSG)
    with open(project.llm_cache_path, "ab") as fh:
        fh.write(b'{"key": "abc", "model": "openai/stub-mo')  # a crash mid-append
    with project.lock(), LLMClient(project, settings(stub)) as client:  # a writer holding the lock
        assert client.chat(MSG).cached
        client.chat([{"role": "user", "content": "new"}])
    lines = project.llm_cache_path.read_bytes().splitlines()
    assert [orjson.loads(line)["key"] for line in lines][0] == first.key
    assert len(lines) == 2  # the torn line was cut before appending
    assert spend_summary(project)["responses"] == 2


def test_torn_line_is_left_alone_by_a_client_without_the_lock(stub, project):
    """A query (no lock) must not truncate: the tail may be another process's line in progress."""
    with LLMClient(project, settings(stub)) as client:
        client.chat(MSG)
    with open(project.llm_cache_path, "ab") as fh:
        fh.write(b'{"key": "abc", "model": "openai/stub-mo')
    with LLMClient(project, settings(stub)) as client:
        client.chat([{"role": "user", "content": "other"}])
    lines = project.llm_cache_path.read_bytes().splitlines()
    assert lines[1] == b'{"key": "abc", "model": "openai/stub-mo'
    assert spend_summary(project)["responses"] == 2


def test_disabled_client_refuses(project):
    client = LLMClient(project, LLMSettings(model=""))
    assert not client.enabled
    with pytest.raises(UsageError):
        client.chat(MSG)


def test_retry_after_parses_seconds_ms_and_http_dates():
    class Exc(Exception):
        def __init__(self, headers):
            self.litellm_response_headers = headers

    assert retry_after(Exc({"retry-after": "2"})) == 2.0
    assert retry_after(Exc({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    assert retry_after(Exc({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}),
                       now=1445412470.0) == pytest.approx(10.0)
    assert retry_after(Exc({"retry-after": "soon"})) is None
    assert retry_after(Exc({})) is None


def test_with_retries_is_reusable_and_leaves_our_bugs_alone():
    s = LLMSettings(model="m", max_retries=2, backoff_base=0.0)
    calls = []

    async def boom():
        calls.append(1)
        raise KeyError("bug")

    with pytest.raises(KeyError):
        asyncio.run(with_retries(boom, s))
    assert len(calls) == 1

    async def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionError("reset")
        return 42

    assert asyncio.run(with_retries(flaky, s, what="embed-model")) == 42
    calls.clear()

    async def down():
        calls.append(1)
        raise ConnectionError("refused")

    with pytest.raises(LLMError, match="after 2 retries: embed-model: connection failed"):
        asyncio.run(with_retries(down, s, what="embed-model"))
    assert len(calls) == 3


def test_importing_the_module_does_not_import_litellm():
    code = "import sys, hrag_cli.core.llm; print('litellm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_waiter_retries_when_the_request_it_waited_on_was_cancelled(stub, project):
    stub.enqueue(CHAT, StubReply(content="abandoned", delay=0.3))
    stub.set_chat(lambda body: "second")

    async def go(client):
        leader = asyncio.create_task(client.achat(MSG))
        while stub.count() == 0:  # the leader's request is on the wire
            await asyncio.sleep(0.01)
        waiter = asyncio.create_task(client.achat(MSG))
        await asyncio.sleep(0.05)
        leader.cancel()
        return await waiter

    with LLMClient(project, settings(stub)) as client:
        r = asyncio.run(go(client))
    assert r.text == "second" and not r.cached
    assert stub.count() == 2


def test_connection_refused_on_this_machine_is_reported_without_retries(project):
    from tests.stub_server import refused_port

    with refused_port() as port:
        s = LLMSettings(model="openai/stub-model", api_base=f"http://127.0.0.1:{port}/v1", max_retries=6,
                        backoff_base=1.0, timeout=5.0)
        with LLMClient(project, s) as client:
            t0 = time.monotonic()
            with pytest.raises(LLMError, match=r"after 0 retries: openai/stub-model: connection failed"):
                client.chat(MSG)
    assert client.stats.retries == 0 and time.monotonic() - t0 < 2.0


def test_an_unreachable_remote_server_gets_a_short_bounded_retry():
    import httpx

    from hrag_cli.core.llm_retry import CONNECT_RETRIES, with_retries

    calls = []

    async def refused():
        calls.append(time.monotonic())
        raise httpx.ConnectError("All connection attempts failed")

    s = LLMSettings(model="openai/m", api_base="http://192.0.2.1/v1", max_retries=6, backoff_base=0.01)
    with pytest.raises(LLMError, match=r"after 2 retries: openai/m: connection failed"):
        asyncio.run(with_retries(refused, s))
    assert len(calls) == 1 + CONNECT_RETRIES == 3


def test_final_timeout_is_reported_as_timed_out(stub, project):
    stub.set_chat(lambda body: StubReply(content="late", delay=1.0))
    with LLMClient(project, settings(stub, timeout=0.3, max_retries=1)) as client:
        with pytest.raises(LLMError, match=r"^LLM request failed after 1 retries: openai/stub-model: timed out$"):
            client.chat(MSG)
    assert stub.count() == 2


def test_failure_causes_name_what_to_fix(stub, project, monkeypatch):
    """Each way a real server fails maps to one cause; run-level ones stop a run at once."""
    from hrag_cli.core.llm_retry import failure_cause
    from tests.stub_server import context_exceeded, refused_port

    def cause_of(s: LLMSettings, reply: StubReply | None = None):
        if reply is not None:
            stub.enqueue(CHAT, reply)
        with LLMClient(project, s) as client:
            try:
                answer = client.chat([{"role": "user", "content": f"q {len(stub.requests)} {s.model} {s.api_base}"}])
            except LLMError as exc:
                return failure_cause(exc, client.settings)
        raise AssertionError(f"{s} with {reply} was answered: {answer}")

    quick = dict(max_retries=0)
    got = {
        "provider": cause_of(settings(stub, model="local", **quick)),
        "context": cause_of(settings(stub, **quick), context_exceeded(512)),
        "server": cause_of(settings(stub, **quick), StubReply(500, content="boom")),
        "timeout": cause_of(settings(stub, timeout=0.2, **quick), StubReply(content="late", delay=1.0)),
        "auth": cause_of(settings(stub, **quick), StubReply(401, content="bad key")),
        "model": cause_of(settings(stub, **quick), StubReply(404, content="no such model")),
    }
    with refused_port() as port:
        got["connection"] = cause_of(settings(stub, api_base=f"http://127.0.0.1:{port}/v1", **quick))
    assert {k: (c.kind if c else None) for k, c in got.items()} == {k: k for k in got}
    assert {k for k, c in got.items() if c.run_level} == {"provider", "auth", "model", "connection"}
    assert "openai/local" in got["provider"].fix and "--n_ctx" in got["context"].fix
    assert cause_of(settings(stub, **quick), StubReply(400, content="bad message role")) is None

    monkeypatch.delenv("OPENAI_API_KEY")          # a remote API without a key: refused before any request
    missing = cause_of(LLMSettings(model="openai/m", api_base="http://192.0.2.1/v1", timeout=3, max_retries=0))
    assert missing.kind == "auth" and missing.run_level and "OPENAI_API_KEY" in missing.fix
