"""Running the extract stage on a Ray cluster (`hrag index --ray auto|ADDRESS`, `[cluster] ray`).

Ray is an optional extra (`pip install 'hrag[ray]'`): nothing here imports it until a run asks for a cluster,
so the single-process path never pays its import.
"""

from __future__ import annotations

import importlib.util
import secrets
import socket
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hrag_cli.core import store
from hrag_cli.core.errors import UsageError

INSTALL_FIX = "pip install 'hrag[ray]'"


def wanted(address: str) -> bool:
    """Whether the settings ask for a cluster ('' or 'off': this process only)."""
    return bool(address.strip()) and address.strip().lower() not in ("off", "none", "local-process")


def require_ray(address: str) -> None:
    """Fail before any stage writes when a cluster is asked for and Ray is not installed (find_spec does not
    import it)."""
    if wanted(address) and importlib.util.find_spec("ray") is None:
        raise UsageError(f"--ray {address}: Ray is not installed; {INSTALL_FIX}")


def connect(address: str) -> Any:
    """The ray module, connected to the cluster at `address` ('auto': the one this machine joined with
    `ray start`); a process already connected (a test's driver) keeps its connection."""
    require_ray(address)
    import ray

    _errors_to_stderr(ray)
    if not ray.is_initialized():
        _reachable(address.strip())
        try:
            ray.init(address=address.strip(), logging_level="WARNING", log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"--ray {address}: cannot reach a Ray cluster ({first}); start one with "
                             "'ray start --head' (then --ray auto) or pass its head's address HOST:6379") from None
    return ray


def _errors_to_stderr(ray: Any) -> None:
    """Ray prints the cluster's error messages (a task retried after its node was lost) on the driver's
    stdout, where `--json` puts its one object: they go to stderr instead."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker, "print_to_stdstream", None)
    if original is None or getattr(original, "hrag_stderr", False):
        return

    def to_stderr(data: dict, ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    to_stderr.hrag_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


def _reachable(address: str) -> None:
    """A HOST:PORT nobody answers on is said at once (Ray itself keeps retrying it for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise UsageError(f"--ray {address}: cannot reach a Ray cluster there ({exc.strerror or exc}); start one "
                         "with 'ray start --head' (then --ray auto) or pass its head's address HOST:6379") from None


CONNECT_TIMEOUT = 10.0


def alive_nodes(ray: Any) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _sees(path: str, token: str) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read() == token
    except OSError:
        return False


def check_shared(ray: Any, root: Path) -> int:
    """Every node must read the project directory at the same path (workers read and the driver writes one
    set of files): a task pinned to each node looks for a marker the driver just wrote. Returns the number
    of nodes; a node that cannot see it is a clear error before any work is sent."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    marker = root / "cache" / f".cluster-check-{secrets.token_hex(4)}"
    token = secrets.token_hex(16)
    marker.parent.mkdir(parents=True, exist_ok=True)
    store.atomic_write_text(marker, token)
    try:
        nodes = alive_nodes(ray)
        probe = ray.remote(num_cpus=0, max_retries=0)(_sees)
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(str(marker), token) for n in nodes]
        seen = ray.get(refs, timeout=CHECK_TIMEOUT)
    finally:
        marker.unlink(missing_ok=True)
    blind = sorted({str(n.get("NodeManagerAddress")) for n, ok in zip(nodes, seen) if not ok})
    if blind:
        raise UsageError(f"the project directory {root} is not readable at that path on node(s) "
                         f"{', '.join(blind)}: put it on storage every node mounts at the same path (NFS, a "
                         "cluster file system) and pass that path with -p")
    return len(nodes)


CHECK_TIMEOUT = 120.0      # seconds for every node to answer the storage check (a busy node queues it)


def ordered_map(ray: Any, fn: Callable[[Any], Any], items: Iterable[Any], window: int) -> Iterator[Any]:
    """fn(item) for each item as Ray tasks, at most `window` at a time, results in the items' order (the
    caller appends them to an append-only ledger as one process would). A task whose worker dies is run again
    elsewhere (Ray's task retries)."""
    remote = ray.remote(max_retries=TASK_RETRIES)(fn)
    pending: deque = deque()
    for item in items:
        pending.append(remote.remote(item))
        if len(pending) >= window:
            yield ray.get(pending.popleft())
    while pending:
        yield ray.get(pending.popleft())


TASK_RETRIES = 5           # a node lost mid-run is not the run's failure
