"""keep_freed_memory (both backends): glibc's malloc keeps the heap that was freed for the next
allocations, so buffers allocated and freed a pass at a time are not new pages each time."""

import errno
import subprocess
import sys

import pytest

from edgebroker._native import _cbackend as C
from edgebroker._native import _pure as P

# Allocates and frees 32 buffers of 64 KiB (a loop pass of large payloads), 40 times, and
# prints the minor page faults that took. With the heap kept, only the first round's pages
# are new.
CHURN = """
import resource, sys
from edgebroker._native import {module} as impl
if sys.argv[1] == "keep":
    assert impl.keep_freed_memory(8 << 20, 4 << 20) == 0
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    held = [bytearray(65536) for _ in range(32)]
    del held
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""


def faults(module: str, mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHURN.format(module=module), mode],
                         capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout)


@pytest.mark.parametrize("impl", [C, P], ids=["c", "python"])
def test_values_are_checked(impl):
    assert impl.keep_freed_memory(8 << 20, 4 << 20) == 0
    assert impl.keep_freed_memory(-1, 4 << 20) == errno.EINVAL
    assert impl.keep_freed_memory(8 << 20, 1 << 40) == errno.EINVAL


@pytest.mark.parametrize("module", ["_cbackend", "_pure"])
def test_freed_buffers_are_reused_instead_of_faulted_in_again(module):
    kept, default = faults(module, "keep"), faults(module, "default")
    pages_per_round = 32 * 65536 // 4096
    assert kept < 2 * pages_per_round, (kept, default)          # the first round's, about
    assert default > 10 * pages_per_round, (kept, default)      # new pages in every round


# 32 MiB of heap freed in 64 KiB holes between blocks still in use (kept by keep_freed_memory:
# nothing goes back by itself), then released; prints the resident bytes that went back.
RELEASE = """
import os
from edgebroker._native import {module} as impl
assert impl.keep_freed_memory(64 << 20, 4 << 20) == 0
def resident():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
pairs = [(bytearray(65536), bytearray(1024)) for _ in range(512)]
still_used = [small for _, small in pairs]
del pairs
kept = resident()
assert impl.release_freed_memory() == 0
print(kept - resident())
"""


@pytest.mark.parametrize("module", ["_cbackend", "_pure"])
def test_release_gives_freed_heap_back(module):
    """release_freed_memory (App.start calls it once before READY=1) gives back the whole
    pages of freed heap that keep_freed_memory would keep."""
    out = subprocess.run([sys.executable, "-c", RELEASE.format(module=module)],
                         capture_output=True, text=True, timeout=60, check=True)
    assert int(out.stdout) > 24 << 20, out.stdout


def test_twin_without_ctypes():
    """The one-file binary is built without ctypes (packaging/edgebroker.spec): the twin still
    imports there, and the three calls that need the C library say ENOSYS."""
    code = ("import sys; sys.modules['ctypes'] = None\n"
            "from edgebroker._native import _pure as P\n"
            "print(P.keep_freed_memory(8 << 20, 4 << 20), P.release_freed_memory(), "
            "P.fallocate(0, 4096))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split() == [str(errno.ENOSYS)] * 3
