"""`fix_mmap_threshold`: an FSDP rank maps every buffer of 128 KiB or more on its own.

Each case runs in a fresh interpreter (glibc's allocator settings are per process and cannot be
undone): free a 16 MiB buffer, which by default raises glibc's mmap threshold to 16 MiB, then
allocate 1 MiB and read from `mallinfo2` whether it came from a mapping of its own.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gyre_train.backends.fsdp import fix_mmap_threshold

_PROBE = """
import ctypes, sys
from gyre_train.backends.fsdp import fix_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
fixed = fix_mmap_threshold() if sys.argv[1] == "fix" else False
libc.free(libc.malloc(16 << 20))  # by default: the threshold rises to 16 MiB
before = libc.mallinfo2().hblkhd
kept = libc.malloc(1 << 20)
print(fixed, libc.mallinfo2().hblkhd - before >= (1 << 20))
"""

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")


def _probe(arg: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, arg], capture_output=True, text=True, check=True, env=env
    )
    return done.stdout.strip()


@glibc
def test_a_fixed_threshold_maps_a_megabyte_after_a_larger_buffer_was_freed() -> None:
    assert _probe("fix") == "True True"


@glibc
def test_by_default_glibc_carves_that_megabyte_from_the_heap() -> None:
    """The control: without the fix the same allocation is not mapped on its own, so the case
    above measures the fix, not the probe."""
    assert _probe("none") == "False False"


@glibc
def test_a_threshold_the_process_was_started_with_is_left_alone() -> None:
    assert fix_mmap_threshold({"MALLOC_MMAP_THRESHOLD_": "1048576"}) is False
    started_with = {"MALLOC_MMAP_THRESHOLD_": "33554432", "PATH": "/usr/bin:/bin"}
    assert _probe("fix", started_with) == "False False"
