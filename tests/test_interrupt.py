"""core/interrupt.py in this process, with real signals: an event loop run through `interrupt.run` unwinds (its
`finally` blocks run) and raises Interrupted, whether or not the code below swallows the cancellation, and the
previous handlers come back after. The whole CLI under a signal is tested in test_index_e2e.py."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from hrag_cli.core import interrupt


def _raise_soon(sig: int) -> None:
    asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_cancels_the_loop_and_its_finally_blocks_run(sig: int) -> None:
    unwound: list[str] = []

    async def waits_for_an_answer() -> None:
        _raise_soon(sig)
        try:
            await asyncio.sleep(60)          # a request that would take a minute
        finally:
            unwound.append("closed")

    before = {s: signal.getsignal(s) for s in interrupt.SIGNALS}
    with interrupt.handled(), pytest.raises(interrupt.Interrupted) as caught:
        interrupt.run(waits_for_an_answer)
    assert caught.value.signum == sig and caught.value.exit_code == 128 + sig
    assert interrupt.stopped() is caught.value and unwound == ["closed"]
    assert {s: signal.getsignal(s) for s in interrupt.SIGNALS} == before


def test_a_swallowed_cancellation_still_stops_the_run() -> None:
    async def swallows() -> str:
        _raise_soon(signal.SIGTERM)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "carried on"
        return "finished"

    with interrupt.handled(), pytest.raises(interrupt.Interrupted):
        interrupt.run(swallows)


def test_a_sigint_inherited_ignored_stays_ignored_and_sigterm_still_stops() -> None:
    """A background job of a script: the terminal's Ctrl-C must not reach it; `kill` (SIGTERM) stops it."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupt.handled():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):            # a handler would run between bytecodes
                pass
            with pytest.raises(interrupt.Interrupted):
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):
                    pass
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)
