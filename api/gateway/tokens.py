"""Prompt length before the engine sees it: for the context-length check and the TPM reservation.

Cheap by default: UTF-8 bytes / 4 plus a few tokens per chat message. When a prompt is long enough
to matter for the model's context (``bytes >= context_length / 2``) and the model's catalogue
``source`` is a local folder with a ``tokenizer.json``, the real tokenizer (Hugging Face
``tokenizers``, loaded once per model) counts it exactly; the chat template adds a few tokens that
stay estimated. The reservation is corrected with the engine's own usage after the request, so an
estimate only has to be in the right range.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from baton.core import errors

log = logging.getLogger(__name__)

PER_MESSAGE = 4  # role and separators of a chat template, per message
PER_CHAT = 3


class InvalidTextError(errors.ValidationError):
    """Text that is not Unicode: a lone surrogate (``"\\ud800"`` in the JSON) no engine can tokenize."""

    def __init__(self, param: str | None = None) -> None:
        super().__init__("The request holds text that is not valid Unicode (a lone surrogate such as \\ud800). "
                         "Send well-formed UTF-8 text.", param=param)


def utf8(text: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate is the client's error (400), never an engine's crash."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidTextError() from None


def surrogate_path(value: Any, path: str = "") -> str | None:
    """Where in a decoded JSON body a string holds a lone surrogate (``messages[0].content``), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or None
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            found = surrogate_path(k, path) or surrogate_path(v, f"{path}.{k}" if path else str(k))
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = surrogate_path(v, f"{path}[{i}]")
            if found:
                return found
    return None


@contextlib.contextmanager
def text_of(payload: dict[str, Any]) -> Iterator[None]:
    """Names the field of ``payload`` whose text is not Unicode when the block inside finds one."""
    try:
        yield
    except InvalidTextError:
        raise InvalidTextError(surrogate_path(payload)) from None


def _texts(content: Any) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    yield text
            elif isinstance(part, str):
                yield part


class PromptCounter:
    """Counts prompt tokens; thread-safe, tokenizers cached per model source."""

    def __init__(self) -> None:
        self._tokenizers: dict[str, Any] = {}
        self._lock = threading.Lock()

    def chat_text(self, messages: list[dict[str, Any]]) -> tuple[str, int]:
        """The concatenated text of the messages and the template overhead in tokens."""
        parts: list[str] = []
        for msg in messages:
            if isinstance(msg, dict):
                parts.extend(_texts(msg.get("content")))
        return "\n".join(parts), PER_CHAT + PER_MESSAGE * len(messages)

    def count(self, text: str, *, source: str, context_length: int, overhead: int = 0) -> tuple[int, bool]:
        """(tokens, exact?) for ``text``. Exact only when the local tokenizer was used."""
        nbytes = len(text) if text.isascii() else len(utf8(text))
        if nbytes * 2 < context_length:
            return nbytes // 4 + 1 + overhead, False
        tok = self.tokenizer(source)
        if tok is None:
            return nbytes // 4 + 1 + overhead, False
        return len(tok.encode(text, add_special_tokens=False).ids) + overhead, True

    def loaded(self, source: str) -> bool:
        """Whether ``source``'s tokenizer (or its absence) is known: counting then reads no file."""
        return source in self._tokenizers

    def tokenizer(self, source: str) -> Any:
        """The model's tokenizer when ``source`` is a local folder that has one, else None."""
        if source in self._tokenizers:
            return self._tokenizers[source]
        with self._lock:
            if source not in self._tokenizers:
                self._tokenizers[source] = _load(source)
        return self._tokenizers[source]


def _load(source: str) -> Any:
    path = Path(source) / "tokenizer.json"
    try:
        if not path.is_file():
            return None
        from tokenizers import Tokenizer  # deferred: only for a model whose tokenizer is read

        return Tokenizer.from_file(str(path))
    except Exception as exc:  # a broken tokenizer file must not fail requests: fall back to estimates
        log.warning("tokenizer at %s not usable (%s); estimating prompt lengths", source, type(exc).__name__)
        return None


def count_completion_prompt(prompt: Any, counter: PromptCounter, *, source: str, context_length: int) -> int:
    """Tokens of a legacy completions ``prompt``: text, list of texts, token ids or lists of token ids.

    With several prompts the longest decides (each is its own sequence)."""
    if isinstance(prompt, str):
        return counter.count(prompt, source=source, context_length=context_length)[0]
    if isinstance(prompt, list):
        if not prompt:
            return 0
        if all(isinstance(x, int) for x in prompt):
            return len(prompt)
        return max(
            (count_completion_prompt(p, counter, source=source, context_length=context_length) for p in prompt),
            default=0,
        )
    return 0


def prompt_count(prompt: Any) -> int:
    """How many sequences a completions ``prompt`` holds."""
    if isinstance(prompt, list) and prompt and not all(isinstance(x, int) for x in prompt):
        return len(prompt)
    return 1
