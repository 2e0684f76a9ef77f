"""The eval's cost of ``export_rollouts`` while a backend's worker builds traces (issue 40).

With live traces on, a backend's worker spends long stretches in Python (building and encoding
a batch of traces). The eval's thread gets the GIL back from it only when the interpreter's
switch interval (5 ms) forces it, so any step of ``export_rollouts`` that lets the GIL go (a C
call that releases it for a large input, as blake3 does from 2 KiB) can cost the caller a whole
switch interval: a NeMo Gym rollout is larger than that. These tests stretch the switch interval
so that such a hand-over cannot hide in the noise.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from gym_artifacts.live.content import LoggedRollouts

SWITCH_S = 2.0  # the interpreter's switch interval during a test: a hand-over costs this long


@contextmanager
def busy_worker() -> Iterator[None]:
    """A thread that wants the GIL all the time (a worker encoding traces), with the switch
    interval at ``SWITCH_S``; the caller holds the GIL when the block starts."""
    old = sys.getswitchinterval()
    stop = threading.Event()

    def spin() -> None:
        time.sleep(0.05)  # the caller takes the GIL back first
        while not stop.is_set():
            pass

    sys.setswitchinterval(SWITCH_S)
    thread = threading.Thread(target=spin, daemon=True)
    try:
        thread.start()
        time.sleep(0.1)  # the spinner runs and waits for the GIL from here
        yield
    finally:
        stop.set()
        thread.join(10 * SWITCH_S)
        sys.setswitchinterval(old)


def test_the_caller_s_hash_of_its_rollouts_never_hands_the_gil_to_a_busy_worker() -> None:
    faulthandler.dump_traceback_later(60, exit=True)  # a hang fails the run instead of blocking it
    try:
        rollout = {"responses_create_params": {"input": "q"}, "response": {"output": "x" * (1 << 20)}}
        logged = LoggedRollouts()
        with busy_worker():
            started = time.perf_counter()
            for _ in range(8):
                logged.add([rollout])
            took = time.perf_counter() - started
        assert logged.identity() is not None
        # 8 MB canonicalised and hashed: milliseconds; one hand-over to the spinner: SWITCH_S.
        assert took < SWITCH_S / 2, f"export_rollouts' hash waited {took:.2f} s for the GIL"
    finally:
        faulthandler.cancel_dump_traceback_later()


def test_the_caller_s_digest_is_blake3_s_digest_of_the_whole_record() -> None:
    """Hashed in pieces on the caller's thread, a record's digest is the one the export's read of
    the file computes (``JsonlDigest``), so a live run's rollouts still match ``OUT.jsonl``."""
    import orjson

    from gym_artifacts.core.jsonio import canonical_record
    from gym_artifacts.run.digests import JsonlDigest

    for size in (0, 1, 1023, 1024, 1025, 2047, 2048, 4096, 100_000):
        rollout = {"response": {"output": "é" * size}}
        logged = LoggedRollouts()
        logged.add([rollout])
        whole = JsonlDigest()
        whole.add_record_bytes(canonical_record(orjson.dumps(rollout), "<x>", 1))
        assert logged.identity() == whole.hexdigest(), size
