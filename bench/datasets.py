"""Prompts for the load generator: random prompts of a fixed token length, a shared-prefix set and a
long/short mix.

With a tokenizer (a local model folder holding ``tokenizer.json``), prompts are random token ids of
the model's own vocabulary decoded to text and re-encoded until the length is exact, the way
``vllm bench serve --dataset-name random`` builds them. Without one, prompts are words from a fixed
list, one token each for a byte-level BPE trained on ordinary text only approximately; the report then
takes prompt lengths from the server's ``usage``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

_WORDS_TEXT = (
    "the of and to in is was for on that with as by at from his her it an are this be which or had "
    "not but were have their one all also its has been they who new after more first two other time "
    "can when into only during some over year there most about would these out up than many school "
    "made later such world where city before used while through years three then known both under"
)
WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    prompt_len: int
    output_len: int
    kind: str = "random"


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    def special_ids(self) -> set[int]: ...


class HFTokenizer:
    """A ``tokenizers`` tokenizer loaded from a model folder's ``tokenizer.json`` (no transformers)."""

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(folder)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"{file} does not exist (expected a model folder with tokenizer.json)")
        self._tok = Tokenizer.from_file(str(file))
        self._specials = {i for t, i in self._tok.get_vocab(with_added_tokens=True).items()
                          if t.startswith("<|") and t.endswith("|>")}
        for added in getattr(self._tok, "get_added_tokens_decoder", dict)():
            self._specials.add(int(added))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def special_ids(self) -> set[int]:
        return set(self._specials)


def stable_ids(tok: TextTokenizer) -> list[int]:
    """Token ids that are safe to draw at random: whole words with a leading space (`` the``) that
    encode back to themselves. A sequence of them re-encodes to the same ids (BPE never merges across
    the pre-tokenizer's word boundaries), so prompt lengths come out exact. Falls back to every
    non-special id whose text round-trips when the vocabulary has few such words."""
    specials = tok.special_ids()
    words, clean = [], []
    for i in range(tok.vocab_size):
        if i in specials:
            continue
        text = tok.decode([i])
        if not text or "\ufffd" in text or not text.isprintable() or tok.encode(text) != [i]:
            continue
        clean.append(i)
        if text.startswith(" ") and text[1:].isalpha():
            words.append(i)
    if len(words) >= 32:
        return words
    return clean or [i for i in range(tok.vocab_size) if i not in specials]


def exact_prompt(tok: TextTokenizer, rng: random.Random, length: int, *,
                  allowed: list[int] | None = None) -> tuple[str, int]:
    """Random text that encodes to exactly ``length`` tokens (or as close as a few repairs get)."""
    allowed = allowed or stable_ids(tok)
    ids = [rng.choice(allowed) for _ in range(length)]
    text = tok.decode(ids)
    for _ in range(8):
        got = tok.encode(text)
        if len(got) == length:
            return text, length
        got = got[:length] if len(got) > length else got + [rng.choice(allowed) for _ in range(length - len(got))]
        text = tok.decode(got)
    return text, len(tok.encode(text))


def _word_prompt(rng: random.Random, length: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(length))


def random_dataset(n: int, input_len: int, output_len: int, *, seed: int = 0,
                   tokenizer: TextTokenizer | None = None) -> list[SampleRequest]:
    """``n`` prompts of ``input_len`` tokens, each asking for ``output_len`` tokens."""
    rng = random.Random(seed)
    out: list[SampleRequest] = []
    allowed = stable_ids(tokenizer) if tokenizer else None
    for _ in range(n):
        if tokenizer is not None:
            text, plen = exact_prompt(tokenizer, rng, input_len, allowed=allowed)
        else:
            text, plen = _word_prompt(rng, input_len), input_len
        out.append(SampleRequest(text, plen, output_len))
    return out


def prefix_dataset(n: int, prefix_len: int, suffix_len: int, output_len: int, *, num_prefixes: int = 4,
                   seed: int = 0, tokenizer: TextTokenizer | None = None) -> list[SampleRequest]:
    """``n`` prompts made of one of ``num_prefixes`` shared prefixes of ``prefix_len`` tokens followed by
    a distinct random suffix of ``suffix_len`` tokens (prefix caching and LMCache hit on the prefix)."""
    rng = random.Random(seed)
    if tokenizer is not None:
        allowed = stable_ids(tokenizer)
        prefixes = [exact_prompt(tokenizer, rng, prefix_len, allowed=allowed)[0] for _ in range(num_prefixes)]
    else:
        prefixes = [_word_prompt(rng, prefix_len) for _ in range(num_prefixes)]
    out: list[SampleRequest] = []
    for i in range(n):
        prefix = prefixes[i % num_prefixes]
        if tokenizer is not None:
            suffix, _ = exact_prompt(tokenizer, rng, suffix_len, allowed=allowed)
            text = prefix + suffix
            plen = len(tokenizer.encode(text))
        else:
            text, plen = prefix + " " + _word_prompt(rng, suffix_len), prefix_len + suffix_len
        out.append(SampleRequest(text, plen, output_len, kind=f"prefix{i % num_prefixes}"))
    return out


def mix_dataset(n: int, *, long_len: int, short_len: int, long_fraction: float, output_len: int,
                seed: int = 0, tokenizer: TextTokenizer | None = None) -> list[SampleRequest]:
    """A long-prompt/short-prompt mix: ``round(n x long_fraction)`` long requests at positions shuffled
    by ``seed``. Long prefills interfere with short requests' decode in aggregated serving; P/D takes
    them apart."""
    if not 0 <= long_fraction <= 1:
        raise ValueError("long_fraction must be within 0..1")
    rng = random.Random(seed)
    n_long = round(n * long_fraction)
    kinds = ["long"] * n_long + ["short"] * (n - n_long)
    rng.shuffle(kinds)
    longs = random_dataset(sum(k == "long" for k in kinds), long_len, output_len, seed=seed + 1, tokenizer=tokenizer)
    shorts = random_dataset(sum(k == "short" for k in kinds), short_len, output_len, seed=seed + 2,
                            tokenizer=tokenizer)
    li, si = iter(longs), iter(shorts)
    out = []
    for k in kinds:
        s = next(li) if k == "long" else next(si)
        out.append(SampleRequest(s.prompt, s.prompt_len, s.output_len, kind=k))
    return out


def build_dataset(name: str, n: int, *, input_len: int, output_len: int, seed: int,
                  tokenizer: TextTokenizer | None, **extra: Any) -> list[SampleRequest]:
    if name == "random":
        return random_dataset(n, input_len, output_len, seed=seed, tokenizer=tokenizer)
    if name == "prefix":
        return prefix_dataset(n, int(extra.get("prefix_len", 256)), input_len, output_len,
                              num_prefixes=int(extra.get("num_prefixes", 4)), seed=seed, tokenizer=tokenizer)
    if name == "mix":
        return mix_dataset(n, long_len=int(extra.get("long_len", 2048)), short_len=input_len,
                           long_fraction=float(extra.get("long_fraction", 0.2)), output_len=output_len,
                           seed=seed, tokenizer=tokenizer)
    raise ValueError(f"unknown dataset {name!r} (random, prefix, mix)")
