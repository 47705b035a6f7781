"""Word count: flat_map split -> key_by word -> stateful count. The smallest order-sensitive flow.

Run it:  driftstream run driftstream.examples.wordcount:flow --parallelism 2
"""

from __future__ import annotations

import random
from typing import Optional

from driftstream.engine import Flow
from driftstream.engine.model.connectors import Source
from driftstream.engine.testing import MemorySink, MemorySource


def corpus(lines: int = 20_000, words_per_line: int = 10, vocabulary: int = 1_000, seed: int = 1) -> list:
    """Deterministic text: ``lines`` lines of random words ``w0 .. w{vocabulary-1}``."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(vocabulary)]
    return [" ".join(rng.choice(vocab) for _ in range(words_per_line)) for _ in range(lines)]


def count(n: Optional[int], word: str) -> tuple:
    """The running count of a word; emits ``(word, count)`` for every occurrence."""
    n = (n or 0) + 1
    return n, (word, n)


def build(name: str = "wordcount", source: Optional[Source] = None, sink_name: str = "counts") -> Flow:
    """The word-count flow over ``source`` (default: the corpus in two partitions)."""
    f = Flow(name)
    src = source if source is not None else MemorySource(corpus(), partitions=2)
    (
        f.source(src, name="lines")
        .flat_map(str.split, name="split")
        .key_by(lambda w: w, name="by_word")
        .stateful_map(count, name="count")
        .sink(MemorySink(sink_name))
    )
    return f


flow = build()
