"""What an engine's error message may tell a client.

The engines' 4xx messages are meant for the client, but they arrive wrapped in the serving layer's own
detail: Ray Serve LLM sends ``Message: <text> (Request ID: <its id>), Internal exception: <same>,
original exception: <str(exception)>`` (``ray.llm._internal.serve.utils.server_utils``), and vLLM's
messages can carry pydantic's dumps, module paths and tracebacks. :func:`client_text` keeps the one
sentence a client can act on and drops the rest: other layers' request ids, exception class names,
module paths, stack lines and pydantic's links. It never returns an empty string.
"""

from __future__ import annotations

import re

#: When nothing readable is left.
FALLBACK = "The model rejected the request."

_RAY_WRAPPED = re.compile(r"^\s*Message:\s*(?P<msg>.*?),\s*Internal exception:", re.S)
_CUT_AT = ("Traceback (most recent call last)", "Internal exception:", "original exception:")
_REQUEST_ID = re.compile(r"\s*[(\[]\s*(?:Request ID|request_id|request id)\s*[:=][^)\]]*[)\]]", re.I)
_MODULE_PATH = re.compile(r"\b(?:ray|vllm|lmcache|nixl|torch|pydantic|pydantic_core|fastapi|starlette|baton|uvicorn"
                          r"|transformers)(?:\.[A-Za-z_]\w*)+(?::\d+)?")
_CLASS_PREFIX = re.compile(r"^\s*(?:[A-Z]\w*(?:Error|Exception)):\s*")
_CLASS_NAME = re.compile(r"\b[A-Z][a-z]\w*?(?:Error|Exception)\b")
_PYDANTIC_HEADER = re.compile(r"\b\d+ validation errors? for [A-Za-z_]\w*\s*", re.I)
_PYDANTIC_TAIL = re.compile(r"\s*\[type=[^\]]*\]")
_PYDANTIC_LINK = re.compile(r"\s*For further information visit \S+")
_FILE_LINE = re.compile(r'\s*File "[^"]*", line \d+.*')


def client_text(raw: str, *, limit: int = 500) -> str:
    """The readable part of an engine's error message (see the module docstring)."""
    m = _RAY_WRAPPED.match(raw)
    text = m.group("msg") if m else raw
    for marker in _CUT_AT:
        at = text.find(marker)
        if at >= 0:
            text = text[:at]
    text = _REQUEST_ID.sub("", text)
    text = _FILE_LINE.sub("", text)
    text = _PYDANTIC_LINK.sub("", text)
    text = _PYDANTIC_TAIL.sub("", text)
    text = _PYDANTIC_HEADER.sub("", text)
    text = _MODULE_PATH.sub("", text)
    text = _CLASS_PREFIX.sub("", text)
    text = _CLASS_NAME.sub("", text)
    text = " ".join(text.split()).strip(" ,;:-")
    text = re.sub(r"\(\s*\)", "", text).strip(" ,;:-")
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text if any(c.isalpha() for c in text) else FALLBACK
