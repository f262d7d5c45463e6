"""The built-in text the tiny model's tokenizer is trained on (generated, so nothing is downloaded)."""

from __future__ import annotations

import random
from collections.abc import Iterator

_PARAGRAPHS = (
    "A serving platform turns a model into an endpoint that many tenants can call at once.",
    "Prefill reads the whole prompt and writes the key and value cache; decode then produces one "
    "token at a time and reads that cache again and again.",
    "When prefill and decode share a worker, a long prompt stalls every stream that is decoding.",
    "Disaggregation moves prefill to its own pool, and the cache travels from one pool to the other.",
    "The size of the cache is two times layers times heads times head size times tokens times bytes.",
    "A transfer can never be faster than the number of bytes divided by the bandwidth of the link.",
    "Goodput counts the requests per second that meet both the first token and the per token target.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun.",
    "Once upon a time there was a little village by the sea, where fishermen mended their nets.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 4096 appear in logs and configs.",
    "Questions? Answers! Lists: one, two, three; quotes \"like this\" and 'like that' (and brackets).",
    'def handler(request): return {"status": 200, "body": request.json()}',
    "SELECT id, name FROM tenants WHERE active = true ORDER BY created_at DESC LIMIT 10;",
)

_SUBJECTS = (
    "the engine",
    "a replica",
    "the gateway",
    "our tenant",
    "the scheduler",
    "a worker",
    "the proxy",
    "the planner",
    "the reconciler",
    "a client",
    "the cache",
    "the model",
    "every request",
    "the pool",
    "a small robot",
    "the old sailor",
    "my neighbour",
    "the teacher",
    "a curious child",
    "the river",
    "the mountain",
    "a quiet library",
    "the market",
    "the garden",
    "an orange cat",
    "the storm",
)
_VERBS = (
    "reads",
    "writes",
    "moves",
    "stores",
    "loads",
    "sends",
    "receives",
    "measures",
    "counts",
    "schedules",
    "retries",
    "recovers",
    "streams",
    "splits",
    "balances",
    "watches",
    "remembers",
    "forgets",
    "builds",
    "opens",
    "closes",
    "carries",
    "follows",
    "explains",
    "answers",
    "finds",
    "paints",
    "sings",
    "plants",
    "crosses",
    "climbs",
    "visits",
    "borrows",
    "cooks",
    "repairs",
)
_OBJECTS = (
    "the prompt",
    "a token",
    "the blocks",
    "the tensors",
    "a message",
    "the answer",
    "the stream",
    "the queue",
    "the logs",
    "a trace",
    "the metrics",
    "the weights",
    "the budget",
    "the limits",
    "a story",
    "the letters",
    "the bread",
    "the bridge",
    "a lantern",
    "the harbour",
    "the map",
    "a green apple",
    "the window",
    "the melody",
    "the puzzle",
    "a warm blanket",
    "the evening news",
)
_TAILS = (
    "before noon",
    "after the restart",
    "without any delay",
    "with great care",
    "in the morning",
    "at night",
    "under heavy load",
    "on the second try",
    "for every tenant",
    "across the network",
    "near the station",
    "during the festival",
    "because it was raining",
    "as fast as it could",
    "while nobody was looking",
    "in less than a second",
    "from the remote tier",
    "to the decode pool",
)


def corpus_lines(seed: int, n_sentences: int = 6000) -> Iterator[str]:
    """The training text: fixed paragraphs plus ``n_sentences`` sentences drawn with ``seed``."""
    rng = random.Random(seed)
    yield from _PARAGRAPHS
    for i in range(n_sentences):
        sentence = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"
        if i % 3 == 0:
            sentence = sentence.capitalize() + "."
        elif i % 3 == 1:
            sentence = f"Why {sentence}? Because {rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} it."
        else:
            sentence = f"{sentence.capitalize()}, said {rng.choice(_SUBJECTS)}, {rng.randint(0, 9999)} times."
        yield sentence
