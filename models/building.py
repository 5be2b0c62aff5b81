"""One transformers model is built at a time in this process, and a build changes nothing for
other threads.

The daemon builds torch models in several worker threads: the verifier's fingerprinting
backend (models/fingerprint.py, from a GGUF: models/gguf_torch.py), the agent card embedder
(models/embedder.py), inference stages (models/blocks.py). Two builds at once break in two
ways:

* transformers 5 resolves its names lazily (a ``_LazyModule``): a thread that imports from it
  while another thread is still importing the same submodule can see it half-initialized and
  fail with ``ImportError: cannot import name 'AutoModelForCausalLM'``;
* loading a model changes process-wide state for its duration (transformers skips weight
  initialization through module-level switches while it loads), so a model built in another
  thread meanwhile can come out wrong.

So every model build (its transformers imports, construction and weight loading) runs inside
:func:`building`, a process-wide re-entrant lock (a build may call another: a GGUF backend
load builds the model inside its own build). Running a built model needs no lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_BUILD_LOCK = threading.RLock()


@contextmanager
def building() -> Iterator[None]:
    """Hold the process's model-build lock for the block (blocking: call it in a thread)."""
    with _BUILD_LOCK:
        yield
