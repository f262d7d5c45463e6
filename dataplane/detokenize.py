"""A stream's text when its prompt ends inside a character, as a resumed stream's continuation does.

The gateway resumes a broken stream by sending ``prompt ids + the ids already sent`` to an engine
(:mod:`baton.api.gateway.relay`). The break can fall right after a token whose text the engine had not
emitted yet: a token that holds part of a multi-byte character, or bytes that are no character at all
(their ``U+FFFD`` comes out with a later token). A chunk can carry several tokens, so the gateway
cannot always tell. The continuation's prompt then decodes to text that ends in ``U+FFFD``.

vLLM's fast detokenizer primes tokenizers' ``DecodeStream`` with the whole prompt
(``DecodeStream(ids=prompt)``). With a prompt like that the stream keeps an empty prefix, and the first
text it emits is the whole prompt's text followed by the new token's (vLLM issue 48853, open as of vLLM
0.32): the client would get its own prompt in the middle of its answer.

:func:`install` changes how vLLM's ``FastIncrementalDetokenizer`` is primed, in the replica process that
runs the engine's front end (:class:`baton.dataplane.engine.BatonVLLMEngine` calls it). When the prompt's
decoded text ends in ``U+FFFD``, the stream is primed with the prompt up to its last clean boundary (the
longest prefix whose text does not end in ``U+FFFD``: where the undisturbed stream last emitted text),
then steps through the tokens after it as the undisturbed stream did, so their text comes out with the
next token's, byte for byte. Any other prompt (every prompt made from text) is primed as vLLM primes it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

REPLACEMENT = "\ufffd"
#: Tokens decoded to tell whether text ends on a clean boundary: a UTF-8 character has at most 4 bytes,
#: each token at least one, so 8 tokens always hold the start of the last character.
WINDOW = 8
#: How far back from the prompt's end a clean boundary is looked for. Past it (a prompt ending in this
#: many tokens of bytes that are no text) the stream is primed as vLLM primes it.
LOOKBACK = 64


def _ends_clean(tokenizer: Any, ids: Sequence[int], end: int, skip_special_tokens: bool) -> bool:
    if end == 0:
        return True
    return not tokenizer.decode(list(ids[max(0, end - WINDOW):end]),
                                skip_special_tokens=skip_special_tokens).endswith(REPLACEMENT)


def clean_boundary(tokenizer: Any, ids: Sequence[int], *, skip_special_tokens: bool) -> int | None:
    """The length of the longest prefix of ``ids`` whose text does not end in ``U+FFFD`` (``len(ids)``
    when the whole text does not), within :data:`LOOKBACK` tokens of the end; None past it."""
    for end in range(len(ids), max(-1, len(ids) - LOOKBACK - 1), -1):
        if _ends_clean(tokenizer, ids, end, skip_special_tokens):
            return end
    return None


def primed_stream(tokenizer: Any, ids: Sequence[int], *, skip_special_tokens: bool) -> Any | None:
    """A ``DecodeStream`` in the state an undisturbed stream has after ``ids``, when their text ends in
    ``U+FFFD``; None when vLLM's own priming is right (clean end) or no clean boundary is near."""
    from tokenizers.decoders import DecodeStream

    end = clean_boundary(tokenizer, ids, skip_special_tokens=skip_special_tokens)
    if end is None or end == len(ids):
        return None
    stream = DecodeStream(ids=list(ids[:end]), skip_special_tokens=skip_special_tokens)
    for token in ids[end:]:
        # Held back, as in the undisturbed stream: every prefix past `end` ends in U+FFFD.
        if stream.step(tokenizer, token) is not None:
            return None
    return stream


def install() -> bool:
    """Makes vLLM's ``FastIncrementalDetokenizer`` prime its stream with :func:`primed_stream` (once per
    process). Returns whether it is installed."""
    try:
        from vllm.v1.engine import detokenizer
    except ImportError:
        return False
    cls: Any = detokenizer.FastIncrementalDetokenizer  # Any: it carries Baton's two markers below
    if getattr(cls, "_baton_primed", False):
        return True
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, tokenizer: Any, request: Any) -> None:
        original(self, tokenizer, request)
        ids = request.prompt_token_ids
        if not ids:
            return
        try:
            stream = primed_stream(self.tokenizer, ids, skip_special_tokens=self.skip_special_tokens)
        except Exception:  # never fail a request over its priming: vLLM's own stays
            log.exception("priming the detokenizer of %s failed; vLLM's priming kept", self.request_id)
            return
        if stream is not None:
            self.stream = stream

    cls.__init__ = __init__
    cls._baton_vllm_init = original  # vLLM's own, for the test that tells when this can go
    cls._baton_primed = True
    return True
