"""serving.servable: what releasing a retired version gives back to the OS."""
import sys

import pytest

from serving.servable import release_free_memory, resident_bytes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_memory_freed_after_a_retirement_goes_back_to_the_os():
  """What release() adds to dropping the model: freed heap pages leave the process.

  Interleaved small blocks (below glibc's mmap threshold) with every 16th kept pin the
  heap, so freeing the rest does not lower RSS until the pages are trimmed.
  """
  chunks = [bytearray(96 * 1024) for _ in range(2000)]
  for chunk in chunks:
    chunk[::4096] = b"x" * len(chunk[::4096])  # touch every page: resident
  kept = chunks[::16]
  del chunks
  before = resident_bytes()
  freed = release_free_memory()
  assert freed > 60 * 2**20, (before, freed)
  assert resident_bytes() < before - 60 * 2**20
  del kept
