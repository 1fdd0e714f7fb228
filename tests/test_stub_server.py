"""The stub server itself: OpenAI-shaped answers, scripting, counting, and the standalone mode for bench/."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.stub_server import CHAT, EMBED, EMBED_DIM, StubReply, StubServer, hash_vector


def post(url: str, body: dict, timeout: float = 5.0) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_chat_completion_shape_and_default_reply(stub):
    status, _, raw = post(stub.url + CHAT, {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]})
    data = json.loads(raw)
    assert status == 200
    assert data["object"] == "chat.completion" and data["model"] == "stub-model" and data["id"]
    choice = data["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "ok"} and choice["finish_reason"] == "stop"
    u = data["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["completion_tokens"] == 1
    assert stub.count() == 1 and stub.requests[0][1]["messages"][0]["content"] == "hi"


def test_routes_without_v1_prefix_and_unknown_routes(stub):
    root = stub.url[: -len("/v1")]
    assert post(root + CHAT, {"messages": []})[0] == 200
    assert post(root + EMBED, {"input": "x"})[0] == 200
    assert post(root + "/v1/nothing", {})[0] == 404
    assert stub.count(CHAT) == 1 and stub.count(EMBED) == 1
    with pytest.raises(ValueError):
        stub.enqueue("/nothing", StubReply())


def test_scripted_replies_come_first_then_the_responder(stub):
    stub.set_chat(lambda body: body["messages"][-1]["content"].upper())
    stub.enqueue(CHAT, StubReply(429, headers={"Retry-After": "3"}), StubReply(503),
                 StubReply(raw_body=b"{not json"), StubReply(content="scripted"))
    msgs = {"messages": [{"role": "user", "content": "abc"}]}
    status, headers, _ = post(stub.url + CHAT, msgs)
    assert status == 429 and headers["Retry-After"] == "3"
    status, _, raw = post(stub.url + CHAT, msgs)
    assert status == 503 and json.loads(raw)["error"]["message"]
    assert post(stub.url + CHAT, msgs)[2] == b"{not json"
    assert json.loads(post(stub.url + CHAT, msgs)[2])["choices"][0]["message"]["content"] == "scripted"
    assert json.loads(post(stub.url + CHAT, msgs)[2])["choices"][0]["message"]["content"] == "ABC"
    assert stub.count() == 5


def test_delay_and_max_in_flight(stub):
    import threading

    stub.set_chat(lambda body: StubReply(content="slow", delay=0.2))
    t0 = time.monotonic()
    post(stub.url + CHAT, {"messages": []})
    assert time.monotonic() - t0 >= 0.2
    # three requests held inside the server until all three have arrived: in flight together, whatever the load
    barrier = threading.Barrier(3, timeout=20)

    def hold(body):
        barrier.wait()
        return StubReply(content="held")

    stub.set_chat(hold)
    threads = [threading.Thread(target=post, args=(stub.url + CHAT, {"messages": []})) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stub.max_in_flight == 3
    # the server counts a request done just after its reply is sent, so the client may see the reply first
    deadline = time.monotonic() + 5
    while stub.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stub.in_flight == 0


def test_responder_crash_becomes_a_500(stub):
    stub.set_chat(lambda body: 1 / 0)
    status, _, raw = post(stub.url + CHAT, {"messages": []})
    assert status == 500 and "ZeroDivisionError" in json.loads(raw)["error"]["message"]


def test_embeddings_are_deterministic_floats_and_base64(stub):
    _, _, raw = post(stub.url + EMBED, {"model": "e", "input": ["alpha", "beta"], "encoding_format": "float"})
    data = json.loads(raw)
    vecs = [d["embedding"] for d in data["data"]]
    assert [d["index"] for d in data["data"]] == [0, 1] and data["usage"]["prompt_tokens"] > 0
    assert len(vecs[0]) == EMBED_DIM and vecs[0] == hash_vector("alpha") and vecs[0] != vecs[1]
    assert abs(sum(v * v for v in vecs[0]) - 1.0) < 1e-9
    _, _, raw = post(stub.url + EMBED, {"model": "e", "input": "alpha", "encoding_format": "base64"})
    assert isinstance(json.loads(raw)["data"][0]["embedding"], str)


def test_embeddings_through_litellm(stub):
    from hrag_cli.core.llm import import_litellm

    litellm = import_litellm()
    stub.enqueue(EMBED, StubReply(500))
    with pytest.raises(Exception):
        litellm.embedding(model="openai/stub-embed", api_base=stub.url, input=["x"], num_retries=0, max_retries=0)
    assert stub.count(EMBED) == 1  # no retries hidden inside litellm/openai: with_retries owns them
    resp = litellm.embedding(model="openai/stub-embed", api_base=stub.url, input=["alpha", "beta"])
    got = [d["embedding"] for d in resp.data]
    assert len(got) == 2 and got[0] == pytest.approx(hash_vector("alpha"), abs=1e-6)
    stub.set_embed(lambda body: [[1.0] + [0.0] * 3 for _ in body["input"]])
    resp = litellm.embedding(model="openai/stub-embed", api_base=stub.url, input=["a"])
    assert list(resp.data[0]["embedding"]) == [1.0, 0.0, 0.0, 0.0]
    assert stub.count(EMBED) == 3
    stub.enqueue(EMBED, StubReply(500))
    import asyncio

    with pytest.raises(Exception):
        asyncio.run(litellm.aembedding(model="openai/stub-embed", api_base=stub.url, input=["y"], num_retries=0,
                                       max_retries=0))
    assert stub.count(EMBED) == 4


def test_reset_clears_scripts_and_log(stub):
    stub.enqueue(CHAT, StubReply(500))
    stub.set_chat(lambda body: "custom")
    post(stub.url + CHAT, {"messages": []})
    stub.reset()
    assert stub.count() == 0 and stub.requests == []
    assert json.loads(post(stub.url + CHAT, {"messages": []})[2])["choices"][0]["message"]["content"] == "ok"


def test_close_is_quick_even_with_a_slow_request_pending():
    server = StubServer().start()
    server.enqueue(CHAT, StubReply(delay=8.0))
    import threading

    def client() -> None:
        with pytest.raises(OSError):  # the server went away under it
            post(server.url + CHAT, {"messages": []}, 0.2)

    threading.Thread(target=client, daemon=True).start()
    time.sleep(0.05)
    t0 = time.monotonic()
    server.close()
    assert time.monotonic() - t0 < 4.0   # did not wait for the 8 s reply (margin for a loaded machine)
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url + CHAT, data=b"{}", timeout=0.5)


def test_standalone_process_for_benchmarks():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "tests.stub_server", "--port", str(port)], cwd=root,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f"127.0.0.1:{port}/v1" in line
        status, _, raw = post(f"http://127.0.0.1:{port}/v1{CHAT}", {"messages": [{"role": "user", "content": "x"}]})
        assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_citing_quotes_and_cites_numbered_passages_in_the_order_given(stub):
    from tests.stub_server import citing

    stub.set_chat(citing(2, 1, 2, 7))
    prompt = "Context:\n[1] a.txt\nAlpha text here.\n[2] b.txt\nBeta text.\n\nQuestion: which?"
    _, _, raw = post(stub.url + CHAT, {"model": "m", "messages": [{"role": "user", "content": prompt}]})
    answer = json.loads(raw)["choices"][0]["message"]["content"]
    assert answer == "b.txt [2]. a.txt [1]. b.txt [2]. no such passage [7]."
