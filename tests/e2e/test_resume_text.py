"""A resumed stream's text on the replicas that ship: the continuation the gateway sends after a break
(``prompt + the tokens already sent``, :mod:`baton.api.gateway.relay`) gives exactly the rest of the
text, wherever the break falls, on both pools of the session stack's P/D deployment (the decode pool,
and the prefill pool the gateway falls back to).

The tokens already sent hold characters split across tokens and a byte that is no character, so some
breaks fall inside a character: there vLLM's own priming of the detokenizer emits the whole prompt's text
as the continuation's first delta, and :mod:`baton.dataplane.detokenize`, installed in every replica,
primes it as the undisturbed stream was."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.e2e

#: What the answer so far says (the unit test's, tests/unit/dataplane/test_detokenize.py): Hebrew with a
#: combining mark, an emoji and accents, each split across byte-level tokens, and a lone byte after "he".
ANSWER = "Bonjour ש59בּ60) he, 🙂 festival \u00e9t\u00e9 ok"
PROMPT = "Request 2: tell me about the festival."
REPLACEMENT = "\ufffd"


@pytest.fixture(scope="module")
def tokenizer(baton_stack):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(baton_stack.model_dir))


def _ids(tokenizer) -> tuple[list[int], list[int]]:  # type: ignore[no-untyped-def]
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    lone = next(i for i in range(tokenizer.vocab_size)
                if tokenizer.decode([i]) == REPLACEMENT and tokenizer.decode([i, *enc("a")]) == REPLACEMENT + "a")
    head, tail = ANSWER.split(" he,")
    return enc(PROMPT), [*enc(head + " he"), lone, *enc("," + tail)]


def _stream(url: str, model: str, prompt: list[int]) -> tuple[str, list[int]]:
    """The streamed text and token ids of a greedy continuation, as the gateway reads them."""
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    text, ids = [], []
    with httpx.stream("POST", f"{url}/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                text.append(choice.get("text") or "")
                ids.extend(choice.get("token_ids") or [])
    return "".join(text), ids


@pytest.mark.parametrize("pool", ["decode", "prefill"])
def test_a_continuation_gives_the_rest_of_the_text_wherever_the_break_falls(baton_stack, tokenizer, pool) -> None:  # type: ignore[no-untyped-def]
    app = baton_stack.deployment if pool == "decode" else baton_stack.prefill_app
    url = baton_stack.app_url(app)
    prompt, answer = _ids(tokenizer)
    inside = 0
    for k in range(1, len(answer) + 1):  # a break after k tokens of the answer
        sent = tokenizer.decode(prompt + answer[:k])
        if sent.endswith(REPLACEMENT):  # inside a character (or after the lone byte): its text was held
            inside += 1
        text, ids = _stream(url, baton_stack.model, prompt + answer[:k])
        assert len(ids) == 4, k
        whole = tokenizer.decode(prompt + answer[:k] + ids, skip_special_tokens=True)
        # what the client holds (the held bytes not yet shown) and the continuation make the whole text,
        # less the bytes of a character the last token left unfinished (a stream never shows those)
        assert PROMPT not in text, (k, text)
        shown = sent.rstrip(REPLACEMENT) + text
        assert whole.startswith(shown) and not whole[len(shown):].strip(REPLACEMENT), (k, sent, text, whole)
    assert inside >= 4  # the check covered breaks inside characters, where vLLM's priming leaks the prompt
