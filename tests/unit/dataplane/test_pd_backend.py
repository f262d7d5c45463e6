"""The decode server's wrapper of Ray's connector backend: the prefill request it sends."""

import collections
from types import SimpleNamespace
from typing import Any

from baton.dataplane.pd import _RecordingBackend


class _Inner:
    def prepare_prefill_request(self, *, request: Any, peer: Any) -> Any:
        return SimpleNamespace(**{**vars(request), "max_tokens": 1})


def test_a_client_min_tokens_does_not_make_the_one_token_prefill_request_invalid():
    backend = _RecordingBackend(_Inner(), collections.deque())
    for asked, sent in ((64, 1), (1, 1), (0, 0), (None, None)):
        out = backend.prepare_prefill_request(request=SimpleNamespace(max_tokens=100, min_tokens=asked), peer=None)
        assert (out.max_tokens, out.min_tokens) == (1, sent)
