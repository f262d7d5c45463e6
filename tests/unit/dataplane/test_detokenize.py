"""The engine's streamed text after a resume, wherever the break falls (:mod:`baton.dataplane.detokenize`).

Runs vLLM's own ``FastIncrementalDetokenizer`` on the tiny model's byte-level tokenizer, as the replica's
front end does: an undisturbed stream of a prompt and its answer gives each token's text; a continuation
primed with ``prompt + the first k tokens of the answer`` (what the gateway sends after a break at k) must
give exactly the rest of that text, for every k. The answer holds characters split across tokens and bytes
that are no character, so some breaks fall inside a character and some after a replacement character.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from baton.dataplane import detokenize
from baton.dataplane.tinymodel import build_tiny_model

vllm_detokenizer = pytest.importorskip("vllm.v1.engine.detokenizer")

ANSWER = "Bonjour ש59בּ60) he, 🙂 festival \u00e9t\u00e9 ok"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    folder: Path = build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    return AutoTokenizer.from_pretrained(str(folder))


def _request(prompt_ids: list[int]) -> types.SimpleNamespace:
    from vllm import SamplingParams

    return types.SimpleNamespace(request_id="r", prompt_token_ids=prompt_ids, prompt_embeds=None,
                                 sampling_params=SamplingParams(max_tokens=1000))


def _stream(tokenizer, prompt_ids: list[int], answer_ids: list[int], *, vllm_priming: bool = False) -> list[str]:  # type: ignore[no-untyped-def]
    """The text each token of ``answer_ids`` brings out (one token per step, delta mode)."""
    cls = vllm_detokenizer.FastIncrementalDetokenizer
    if vllm_priming:  # vLLM's own priming, without Baton's
        detok = object.__new__(cls)
        getattr(cls, "_baton_vllm_init", cls.__init__)(detok, tokenizer, _request(prompt_ids))
    else:
        detok = cls(tokenizer, _request(prompt_ids))
    texts = []
    for i, token in enumerate(answer_ids):
        detok.update([token], False)
        texts.append(detok.get_next_output_text(i == len(answer_ids) - 1, True))
    return texts


def _answer(tokenizer) -> tuple[list[int], list[int]]:  # type: ignore[no-untyped-def]
    prompt = tokenizer.encode("Request 2: tell me about the festival.", add_special_tokens=False)
    # A byte that is no character (a lone continuation byte) in the middle of the answer, as a random
    # model writes one: its U+FFFD comes out with the next token.
    a = tokenizer.encode("a", add_special_tokens=False)
    lone = next(i for i in range(tokenizer.vocab_size)
                if tokenizer.decode([i]) == "\ufffd" and tokenizer.decode([i, *a]) == "\ufffda")
    head, tail = ANSWER.split(" he,")
    answer = [*tokenizer.encode(head + " he", add_special_tokens=False), lone,
              *tokenizer.encode("," + tail, add_special_tokens=False)]
    return prompt, answer


@pytest.fixture(autouse=True, scope="module")
def installed() -> None:
    assert detokenize.install()


def test_the_answer_holds_breaks_inside_characters_and_after_replacement_characters(tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt, answer = _answer(tokenizer)
    texts = _stream(tokenizer, prompt, answer)
    held = [k for k, t in enumerate(texts[:-1]) if t == ""]
    assert len(held) >= 4, texts  # the multi-byte characters are split across tokens: their text waits
    assert "\ufffd" in "".join(texts)  # the lone byte comes out as a replacement character
    assert "".join(texts) == tokenizer.decode(answer)


def test_a_continuation_gives_the_rest_of_the_text_wherever_the_break_falls(tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt, answer = _answer(tokenizer)
    texts = _stream(tokenizer, prompt, answer)
    for k in range(len(answer)):  # a break after token k: the continuation's prompt holds it
        rest = _stream(tokenizer, prompt + answer[: k + 1], answer[k + 1:])
        assert "".join(texts[: k + 1]) + "".join(rest) == "".join(texts), k
        assert "".join(rest) == "".join(texts[k + 1:]), k


def test_a_break_at_the_first_token_and_prompts_from_text_are_primed_as_before(tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt, answer = _answer(tokenizer)
    assert detokenize.primed_stream(tokenizer._tokenizer, prompt, skip_special_tokens=True) is None
    texts = _stream(tokenizer, prompt, answer)
    assert "".join(_stream(tokenizer, prompt + answer[:1], answer[1:])) == "".join(texts[1:])


def test_vllms_own_priming_still_leaks_the_prompt(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """What the change is for: once this fails, vLLM primes a prompt that ends inside a character right
    and :mod:`baton.dataplane.detokenize` can go."""
    prompt, answer = _answer(tokenizer)
    texts = _stream(tokenizer, prompt, answer)
    k = next(k for k, t in enumerate(texts[:-1]) if t == "")  # a token whose text the stream held back
    rest = "".join(_stream(tokenizer, prompt + answer[: k + 1], answer[k + 1:], vllm_priming=True))
    assert rest != "".join(texts[k + 1:])
    assert rest.startswith(tokenizer.decode(prompt))
