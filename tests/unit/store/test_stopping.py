"""A stop event that signals set never hangs the process that waits on it.

The child below spins on ``stop.wait(0)``, so its main thread is inside ``Event.wait`` (holding
the event's lock for part of it) whenever a signal lands. Setting the event in the handler
itself hangs that loop on most signals; ``gyre_store.stopping`` must end it every time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from gyre_store.stopping import SignalStop

SPIN = """
import os, signal, sys, threading, time
from gyre_store.stopping import SignalStop

rounds = int(sys.argv[1])
for i in range(rounds):
    with SignalStop([signal.SIGUSR1]) as stop:
        threading.Timer(0.002 + (i % 7) * 0.0007, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        while not stop.wait(0):
            pass
print("ended", rounds, flush=True)
"""


def test_a_signal_ends_a_loop_that_spins_on_the_event_every_time() -> None:
    rounds = 200
    done = subprocess.run(
        [sys.executable, "-c", SPIN, str(rounds)], capture_output=True, text=True, timeout=60
    )  # a hang is a TimeoutExpired: the test fails instead of waiting for good
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ended", str(rounds)]


def test_leaving_the_block_puts_the_previous_handler_back() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, _: seen.append(signum))
    try:
        with SignalStop([signal.SIGUSR2]) as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.wait(5)
            assert seen == []  # ours, not the one before
        os.kill(os.getpid(), signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_the_event_given_is_the_one_set_and_its_relay_ends_on_restore() -> None:
    event = threading.Event()
    stopping = SignalStop([signal.SIGUSR2], event=event)
    assert stopping.install() is event
    relays = [t for t in threading.enumerate() if t.name == "gyre-signal-stop"]
    os.kill(os.getpid(), signal.SIGUSR2)
    assert event.wait(5)
    stopping.restore()
    for relay in relays:
        relay.join(5)
    assert not any(t.is_alive() for t in relays)


def test_until_signal_serves_until_sigterm_in_a_process_of_its_own() -> None:
    with subprocess.Popen(
        [sys.executable, "-c",
         "from gyre_store.stopping import until_signal\n"
         "stop = until_signal()\nprint('up', flush=True)\n"
         "while not stop.wait(0.001):\n    pass\nprint('stopped', flush=True)"],
        stdout=subprocess.PIPE, text=True,
    ) as child:  # fmt: skip
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "up"
        child.send_signal(signal.SIGTERM)
        assert child.wait(30) == 0
        assert child.stdout.read().strip() == "stopped"
