"""Request and response schemas of ``/v1``: typed where Baton acts on a field, permissive elsewhere.

Like OpenAI's API, unknown fields are accepted and passed to the engine (vLLM reads many of its own
extensions: ``top_k``, ``min_p``, ``repetition_penalty``, guided decoding...). Fields the gateway
controls are replaced server-side whatever the client sends (see :data:`SERVER_FIELDS`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

MAX_N = 8
#: OpenAI's limit on stop sequences.
MAX_STOP = 4
#: Prompts in one completions call (vLLM's own bound, VLLM_MAX_COMPLETION_PROMPTS, which Baton leaves at its default).
MAX_PROMPTS = 1024
_INT32 = 2**31 - 1

#: Set by the gateway; a client's value is dropped (``cache_salt`` is replaced by the tenant's).
SERVER_FIELDS = ("cache_salt", "kv_transfer_params", "priority", "request_id", "vllm_xargs")


class _Open(BaseModel):
    # Unknown fields go to the engine (vLLM's own sampling extensions); booleans are JSON booleans only,
    # as OpenAI's API takes them ("yes" is an error, not true).
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    include_usage: StrictBool | None = Field(None, description="Send a last chunk with the request's token usage.")


class ContentPart(_Open):
    type: str = Field(..., description="`text`, or another part type the model accepts.")
    text: str | None = None


class ToolCallFunction(_Open):
    name: str = Field(..., min_length=1, max_length=256)
    arguments: str = Field(..., description="The arguments as a JSON text.")


class ToolCall(_Open):
    """A tool call of an earlier assistant message, as the API returned it."""

    id: str = Field(..., min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None


class _Sampling(_Open):
    model: str = Field(..., min_length=1, max_length=200, description="A model your key may use (`GET /v1/models`).")
    stream: StrictBool | None = Field(False, description="Stream the answer as server-sent events.")
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=_INT32)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1, le=_INT32, description=f"Choices per prompt (Baton serves at most {MAX_N}).")
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = Field(
        None, description=f"Up to {MAX_STOP} sequences where the model stops.")
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    user: str | None = None


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`"""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1, le=_INT32)
    logprobs: StrictBool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    """`POST /v1/completions` (legacy text completions)."""

    prompt: (str | Annotated[list[str], Field(max_length=MAX_PROMPTS)] | list[int]
             | Annotated[list[list[int]], Field(max_length=MAX_PROMPTS)]) = Field(
        ..., description=f"Text, texts, token ids, or lists of token ids (at most {MAX_PROMPTS} prompts)."
    )
    echo: StrictBool | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None


class EmbeddingRequest(_Open):
    """`POST /v1/embeddings` (models the catalogue marks as embedding models)."""

    model: str = Field(..., min_length=1, max_length=200, description="An embedding model your key may use.")
    input: (Annotated[str, Field(min_length=1)] | Annotated[list[str], Field(min_length=1, max_length=2048)]
            | Annotated[list[int], Field(min_length=1)]
            | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1, max_length=2048)]) = Field(
        ..., description="A text, texts, token ids, or lists of token ids (at most 2,048 inputs).")
    encoding_format: Literal["float", "base64"] | None = Field(None, description="`float` (default) or `base64`.")
    dimensions: int | None = Field(None, ge=1, le=_INT32, description="Only for models that support fewer dimensions.")
    user: str | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class CreateEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "baton"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(_Open):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: Usage | None = None


class Completion(_Open):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: Usage | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def _err(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _err("Invalid request: bad JSON, wrong types, unsupported parameters, prompt too long."),
    401: _err("Missing, invalid, expired or revoked API key."),
    403: _err("The organization is suspended."),
    404: _err("The model does not exist or the key may not use it."),
    429: _err("A rate limit was reached; see `Retry-After` and the `x-ratelimit-*` headers."),
    502: _err("The model failed to answer."),
    503: _err("The model is not deployed or not reachable right now."),
    504: _err("The model took too long to answer."),
}


def completion_responses(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "model": model,
            "description": "The completion; with `stream: true`, server-sent events of chunks, then `[DONE]`.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **ERROR_RESPONSES,
    }
