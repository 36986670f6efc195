"""The rerank API tenants' clients speak (Cohere v1 and v2, Jina), answered in front of TEI by calls to TEI itself.

Why here, in the front of each serving pod: what reaches this pod has already been split between the pools by the
model's route, held by the activator while the pool was asleep, and counted by the autoscaler's view of TEI's queue;
translating here bypasses none of that, and needs no component of its own. The shapes and their rules are
:mod:`rerank_contracts.rerank_api`'s; this module does the calls:

1. the request is validated (a 4xx naming the field, before TEI sees anything);
2. documents that may be longer than the model's input (or than ``max_tokens_per_doc``) are tokenized by TEI's own
   ``/tokenize`` (the pod's tokenizer, so the cut is the model's) and cut, or split into overlapping windows when the
   model's long-document mode is ``chunk``; a document that cannot be that long is never tokenized;
3. the texts go to TEI's ``/rerank`` in batches of at most TEI's ``max_client_batch_size``, with the client's
   ``Authorization`` (TEI checks the pool's API key itself); each batch TEI answers is offered to the quality guard's
   sampling as TEI's own request would be;
4. the answer is built in the request's shape, and its cost counted (:class:`.metrics.Metrics`).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rerank_contracts import rerank_api
from rerank_contracts.rerank_api import ApiError, Request, Scored, Window

from .metrics import Metrics
from .relay import Outgoing, Pool, UpstreamError

#: Headers of the client's request passed on to TEI's calls: the API key TEI checks, and the request's id for its logs.
PASSED_HEADERS = frozenset({"authorization", "x-request-id", "traceparent"})
#: TEI's answer header counting the tokens it computed for a request.
TOKENS_HEADER = "x-compute-tokens"


@dataclass(frozen=True)
class ApiSettings:
    """``models``: the names a request's ``model`` may carry (any, when empty); ``served_model``: the name answered;
    ``long_documents``: ``truncate`` (TEI cuts each pair at the model's input) or ``chunk`` (windows, best one)."""

    models: tuple[str, ...] = ()
    served_model: str = ""
    long_documents: rerank_api.LongDocuments = "truncate"


@dataclass(frozen=True)
class Limits:
    """TEI's own limits, read from its ``/info`` once."""

    max_input_tokens: int
    max_client_batch: int


class Translator:
    """Answers rerank API requests with TEI's help (thread-safe: one per front, TEI's limits read once)."""

    def __init__(self, pool: Pool, settings: ApiSettings, metrics: Metrics) -> None:
        self.pool, self.settings, self.metrics = pool, settings, metrics
        self._limits: Limits | None = None
        self._lock = threading.Lock()

    def handle(self, api: rerank_api.Shape, headers: Sequence[tuple[str, str]], body: bytes | None,
               content_type: str | None, offer: Callable[[bytes], None] = lambda body: None
               ) -> tuple[int, dict[str, Any]]:
        """The status and JSON answer for one request; ``offer`` receives each TEI ``/rerank`` body TEI answered
        (the guard's sampling sees the texts TEI scored, in TEI's shape)."""
        passed = [(k, v) for k, v in headers if k.lower() in PASSED_HEADERS]
        try:
            request = rerank_api.parse(api, body or b"", content_type, self.settings.models)
            scored = self._score(request, passed, offer)
        except ApiError as refused:
            self.metrics.api_request(api, "invalid" if refused.status < 500 else "upstream_error")
            return refused.status, refused.body()
        except UpstreamError as exc:
            self.metrics.api_request(api, "upstream_error")
            return exc.status, {"message": f"the model server gave no usable answer: {exc}"}
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # TEI's /info or /tokenize not in its shape
            self.metrics.api_request(api, "upstream_error")
            return 502, {"message": f"the model server's answer is not in TEI's shape: {type(exc).__name__}: {exc}"}
        usage = rerank_api.usage_of(request, scored)
        self.metrics.api_usage(api, usage)
        return 200, rerank_api.answer(request, scored, str(uuid.uuid4()), self.settings.served_model)

    # -- TEI's calls ------------------------------------------------------------------------------------------------

    def _call(self, method: str, path: str, payload: bytes | None, passed: list[tuple[str, str]]
              ) -> tuple[bytes, list[tuple[str, str]]]:
        headers = [*passed, *([("Content-Type", "application/json")] if payload is not None else [])]
        exchange = self.pool.send(Outgoing(method, path, headers, payload))
        try:
            answer = exchange.read_all()
        finally:
            exchange.release()
        if exchange.status >= 500:
            raise UpstreamError(502, f"TEI answered {exchange.status} to {path}: {answer[:300]!r}")
        if exchange.status >= 400:  # the key refused, a text TEI will not take: the client's to see, as TEI said it
            raise ApiError(exchange.status, f"the model server refused the request: {_message(answer)}")
        return answer, exchange.headers

    def limits(self, passed: list[tuple[str, str]]) -> Limits:
        with self._lock:
            if self._limits is None:
                info = json.loads(self._call("GET", rerank_api.TEI_INFO_PATH, None, passed)[0])
                self._limits = Limits(int(info.get("max_input_length") or 512),
                                      max(1, int(info.get("max_client_batch_size") or 32)))
            return self._limits

    def _tokenize(self, texts: list[str], limits: Limits, passed: list[tuple[str, str]]
                  ) -> list[list[tuple[int, int]]]:
        """Each text's tokens as byte offsets, without special tokens."""
        offsets: list[list[tuple[int, int]]] = []
        for start in range(0, len(texts), limits.max_client_batch):
            payload = json.dumps({"inputs": texts[start:start + limits.max_client_batch],
                                  "add_special_tokens": False}, ensure_ascii=False).encode()
            answer = json.loads(self._call("POST", rerank_api.TEI_TOKENIZE_PATH, payload, passed)[0])
            offsets.extend([(int(t["start"]), int(t["stop"])) for t in tokens] for tokens in answer)
        return offsets

    def _windows(self, request: Request, encoded: list[bytes], limits: Limits, passed: list[tuple[str, str]]
                 ) -> list[Window]:
        """The texts to score: one per document, cut at ``max_tokens_per_doc`` when it asks; in the ``chunk`` mode,
        the windows of each document longer than the room beside the query (at most ``max_tokens_per_doc`` tokens
        of it, :data:`~rerank_contracts.rerank_api.DEFAULT_MAX_TOKENS_PER_DOC` by default). ``encoded``: the
        documents' UTF-8, which the windows' byte offsets index."""
        chunk = self.settings.long_documents == "chunk"
        cap = request.max_tokens_per_doc or (rerank_api.DEFAULT_MAX_TOKENS_PER_DOC if chunk else None)
        size = limits.max_input_tokens
        if chunk:  # the query's bytes bound its tokens: the room beside it is at least this
            size = rerank_api.window_size(limits.max_input_tokens, len(request.query.encode("utf-8")))
            if any(rerank_api.may_exceed(t, size) for t in request.texts):
                (query_tokens,) = self._tokenize([request.query], limits, passed)
                size = rerank_api.window_size(limits.max_input_tokens, len(query_tokens))
        bound = min(cap, size) if chunk and cap else cap
        long = [i for i, t in enumerate(request.texts) if bound is not None and rerank_api.may_exceed(t, bound)]
        offsets = dict(zip(long, self._tokenize([request.texts[i] for i in long], limits, passed), strict=True))
        per_doc = request.max_chunks_per_doc or (rerank_api.DEFAULT_MAX_CHUNKS_PER_DOC if request.api == "v1"
                                                 else None)
        spans: list[Window] = []
        for i, text in enumerate(encoded):
            length = len(text)
            if i not in offsets:
                spans.append(Window(i, 0, length))
                continue
            end = rerank_api.cut(offsets[i], cap, length) if cap else length
            tokens = offsets[i][:cap] if cap else offsets[i]
            spans.extend(rerank_api.windows(i, tokens, size, per_doc, end) if chunk else [Window(i, 0, end)])
        if len(spans) > rerank_api.MAX_WINDOWS:
            raise ApiError(422, f"the documents make {len(spans)} windows; at most {rerank_api.MAX_WINDOWS} are "
                           "scored in one request (fewer or shorter documents, or max_chunks_per_doc)", "documents")
        return spans

    def _score(self, request: Request, passed: list[tuple[str, str]], offer: Callable[[bytes], None]) -> Scored:
        limits = self.limits(passed)
        encoded = [t.encode("utf-8") for t in request.texts]
        spans = self._windows(request, encoded, limits, passed)
        texts = [w.of(encoded[w.document]) for w in spans]
        scores: list[float] = []
        tokens = 0
        for start in range(0, len(texts), limits.max_client_batch):
            batch = texts[start:start + limits.max_client_batch]
            payload = rerank_api.tei_body(request.query, batch)
            answer, headers = self._call("POST", rerank_api.TEI_PATH, payload, passed)
            try:
                scores.extend(rerank_api.tei_scores(answer, len(batch)))
            except (ValueError, KeyError, TypeError) as exc:
                raise UpstreamError(502, f"TEI's /rerank answer is not its usual shape: {exc}") from None
            tokens += _tokens(headers)
            offer(payload)
        return Scored(tuple(spans), tuple(scores), tokens)


def _tokens(headers: Sequence[tuple[str, str]]) -> int:
    for name, value in headers:
        if name.lower() == TOKENS_HEADER:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def _message(answer: bytes) -> str:
    """TEI's error ``{"error", "error_type"}`` as one line."""
    try:
        data = json.loads(answer)
    except ValueError:
        return answer[:300].decode("utf-8", errors="replace")
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])
    return json.dumps(data)[:300]
