"""The rerank shapes tenants' clients speak (Cohere v1 and v2, Jina), and how each maps onto TEI's ``POST /rerank``.

Every model's pool pods answer these beside TEI's own route (``rerank_sampler``, the front in each serving pod): a
client built for Cohere or Jina needs only the model's URL as its base URL. This module is the one definition of the
shapes, shared by the front that translates and by the quality guard that reads copies: it parses and validates a
request (:func:`parse`), plans the TEI calls for it (:func:`plan`: one text per document, or, for documents longer
than the model's window, :func:`windows` of it), and builds the answer (:func:`answer`). No I/O here.

The shapes (``POST``, JSON):

- ``/v1/rerank`` (Cohere v1 and Jina): ``{"query", "documents": [str | {"text", ...}], "model"?, "top_n"?,
  "return_documents"?, "rank_fields"?, "max_chunks_per_doc"?}`` -> ``{"id", "results": [{"index",
  "relevance_score", "document"?: {"text", ...}}], "meta": {"api_version", "billed_units": {"search_units"}},
  "model", "usage": {"total_tokens"}}`` (Jina reads ``model``, ``usage`` and ``results``; Cohere ``id``, ``results``
  and ``meta``).
- ``/v2/rerank`` (Cohere v2): ``{"model", "query", "documents": [str], "top_n"?, "max_tokens_per_doc"?}`` -> the
  same answer, ``document`` only when asked.

``relevance_score`` is TEI's score for the same pair (its sigmoid of the model's logit): the same ranking, the same
numbers as a client of TEI's ``/rerank`` gets. Billing follows Cohere's unit: a search unit is one query over up to
:data:`DOCUMENTS_PER_SEARCH_UNIT` scored texts (a document split into windows counts once per window).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: Where each shape is served. Cohere's v1 and Jina's route are the same path and nearly the same shape.
V1_PATH = "/v1/rerank"
V2_PATH = "/v2/rerank"
TEI_PATH = "/rerank"
TEI_TOKENIZE_PATH = "/tokenize"
TEI_INFO_PATH = "/info"
Shape = Literal["v1", "v2"]
API_PATHS: Mapping[str, Shape] = {V1_PATH: "v1", V2_PATH: "v2"}

#: The most documents one request may carry (Cohere's recommended maximum).
MAX_DOCUMENTS = 1000
#: Cohere v2's default for ``max_tokens_per_doc``: a document is cut to this many tokens before it is scored.
DEFAULT_MAX_TOKENS_PER_DOC = 4096
#: The most windows one request may cost in the chunked mode (Cohere v1's limit on documents x chunks).
MAX_WINDOWS = 10000
#: Cohere v1's ``max_chunks_per_doc`` default.
DEFAULT_MAX_CHUNKS_PER_DOC = 10
#: One search unit: one query over up to this many scored texts.
DOCUMENTS_PER_SEARCH_UNIT = 100
#: Tokens a cross-encoder adds around a (query, document) pair: [CLS] q [SEP] d [SEP] (BERT) or <s> q </s></s> d </s>
#: (XLM-R); the larger, so a window always fits.
PAIR_SPECIAL_TOKENS = 4
#: How much consecutive windows of one long document overlap, as a fraction of a window: a passage cut by one
#: window's edge lies whole in the next.
WINDOW_OVERLAP = 0.25

LongDocuments = Literal["truncate", "chunk"]
LONG_DOCUMENTS: tuple[LongDocuments, ...] = ("truncate", "chunk")


class ApiError(Exception):
    """A request refused before TEI sees it: ``status`` (4xx), the ``field`` at fault, a message naming it."""

    def __init__(self, status: int, message: str, field_name: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field_name

    def body(self) -> dict[str, Any]:
        """Cohere's error shape (``message``), with Jina's (``detail``) and the field beside it."""
        return {"message": self.message, "detail": self.message, **({"field": self.field} if self.field else {})}


@dataclass(frozen=True)
class Request:
    """One validated rerank request, whatever shape it came in."""

    api: Shape
    query: str
    texts: tuple[str, ...]
    documents: tuple[Any, ...]  # as the client sent them, for ``return_documents``
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = False
    max_tokens_per_doc: int | None = None
    max_chunks_per_doc: int | None = None


def _decode(body: bytes, content_type: str | None) -> Any:
    media = (content_type or "").partition(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, f"the body must be JSON (Content-Type: application/json), not {media}")
    if not body:
        raise ApiError(400, "the request has no body: a JSON object with query and documents is expected")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the body is not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ApiError:
        raise
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply") from None
    except ValueError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ApiError(400, f"the body is not JSON: {name} is not a JSON value")


def _optional_int(body: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(422, f"{key} must be an integer, not {_kind(value)}", key)
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ApiError(422, f"{key} must be {bound}, not {value}", key)
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _text_of(document: Any, index: int, rank_fields: Sequence[str] | None) -> str:
    """The text scored for one document: the string, or the object's ``text`` (or its ``rank_fields``, in order)."""
    where = f"documents[{index}]"
    if isinstance(document, str):
        return document
    if not isinstance(document, dict):
        raise ApiError(422, f"{where} must be a string or an object with text, not {_kind(document)}", where)
    if rank_fields:
        parts = []
        for name in rank_fields:
            value = document.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise ApiError(422, f"{where}.{name} (a rank field) must be a string, not {_kind(value)}", where)
            parts.append(f"{name}: {value}")
        if not parts:
            raise ApiError(422, f"{where} has none of the rank_fields {list(rank_fields)}", where)
        return "\n".join(parts)
    text = document.get("text")
    if not isinstance(text, str):
        said = "has no text" if text is None else f"has text {_kind(text)}, not a string"
        raise ApiError(422, f"{where} {said}", f"{where}.text")
    return text


def parse(api: Shape, body: bytes, content_type: str | None, models: Sequence[str] = ()) -> Request:
    """Validate a request body; raise :class:`ApiError` naming the field at fault. ``models``: the names this model
    answers to (any ``model`` is accepted when empty; an absent ``model`` always is)."""
    data = _decode(body, content_type)
    if not isinstance(data, dict):
        raise ApiError(400, f"the body must be a JSON object, not {_kind(data)}")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(422, f"model must be a string, not {_kind(model)}", "model")
    if model is not None and models and model not in models:
        raise ApiError(404, f"model {model!r} is not served here; this route serves {', '.join(map(repr, models))}",
                       "model")
    query = data.get("query")
    if not isinstance(query, str):
        raise ApiError(422, "query is required" if query is None else f"query must be a string, not {_kind(query)}",
                       "query")
    if not query.strip():
        raise ApiError(422, "query is empty", "query")
    documents = data.get("documents")
    if not isinstance(documents, list):
        said = "documents is required" if documents is None else f"documents must be an array, not {_kind(documents)}"
        raise ApiError(422, said, "documents")
    if not documents:
        raise ApiError(422, "documents is empty: at least one document is needed", "documents")
    if len(documents) > MAX_DOCUMENTS:
        raise ApiError(422, f"documents has {len(documents)} entries; at most {MAX_DOCUMENTS} are taken", "documents")
    rank_fields = data.get("rank_fields")
    if rank_fields is not None and (not isinstance(rank_fields, list)
                                    or not all(isinstance(f, str) for f in rank_fields)):
        raise ApiError(422, "rank_fields must be an array of strings", "rank_fields")
    texts = tuple(_text_of(d, i, rank_fields) for i, d in enumerate(documents))
    top_n = _optional_int(data, "top_n", 1)
    returned = data.get("return_documents", False)
    if returned is None:
        returned = False
    if not isinstance(returned, bool):
        raise ApiError(422, f"return_documents must be a boolean, not {_kind(returned)}", "return_documents")
    return Request(api=api, query=query, texts=texts, documents=tuple(documents), model=model,
                   top_n=min(top_n, len(texts)) if top_n is not None else None, return_documents=returned,
                   max_tokens_per_doc=_optional_int(data, "max_tokens_per_doc", 1),
                   max_chunks_per_doc=_optional_int(data, "max_chunks_per_doc", 1))


# -- the TEI calls for a request ----------------------------------------------------------------------------------


def may_exceed(text: str, tokens: int) -> bool:
    """Whether ``text`` may be longer than ``tokens`` tokens: every token of a byte-level BPE, a WordPiece or a
    SentencePiece vocabulary covers at least one byte, so a text of no more bytes never is (and is never tokenized)."""
    return len(text.encode("utf-8")) > tokens


@dataclass(frozen=True)
class Window:
    """A scored text: bytes ``[start, end)`` of document ``document``'s UTF-8 (TEI's ``/tokenize`` gives each token's
    byte offsets)."""

    document: int
    start: int
    end: int

    def of(self, text: bytes) -> str:
        """The window's text (a cut inside a character, which token offsets never make, is dropped)."""
        return text[self.start:self.end].decode("utf-8", errors="ignore")


def windows(document: int, offsets: Sequence[tuple[int, int]], size: int, limit: int | None,
            length: int) -> list[Window]:
    """The windows of one document given its tokens' byte ``offsets`` (from TEI's ``/tokenize``, no special
    tokens) and its UTF-8 ``length``: ``size`` tokens each, overlapping by :data:`WINDOW_OVERLAP`, at most ``limit``;
    one window of the whole text when it fits."""
    if len(offsets) <= size:
        return [Window(document, 0, length)]
    stride = max(1, size - int(size * WINDOW_OVERLAP))
    starts = list(range(0, len(offsets) - size + stride, stride))
    if limit is not None:
        starts = starts[:limit]
    spans = []
    for first in starts:
        last = min(first + size, len(offsets)) - 1
        spans.append(Window(document, 0 if first == 0 else offsets[first][0],
                            length if last == len(offsets) - 1 else offsets[last][1]))
    return spans


def cut(offsets: Sequence[tuple[int, int]], tokens: int, length: int) -> int:
    """Where a text of these token ``offsets`` ends once cut to ``tokens`` tokens (its length if it is no longer)."""
    return length if len(offsets) <= tokens else offsets[tokens - 1][1]


def window_size(max_input_tokens: int, query_tokens: int) -> int:
    """How many document tokens fit beside the query in the model's input."""
    return max(16, max_input_tokens - query_tokens - PAIR_SPECIAL_TOKENS)


# -- the answer ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """What one request cost: texts scored (windows count one each), tokens TEI computed, search units."""

    documents: int
    scored: int
    tokens: int

    @property
    def search_units(self) -> int:
        return max(1, math.ceil(self.scored / DOCUMENTS_PER_SEARCH_UNIT))


@dataclass(frozen=True)
class Scored:
    """TEI's scores for a request's texts, one per window (``windows[i]`` scored ``scores[i]``)."""

    windows: tuple[Window, ...]
    scores: tuple[float, ...]
    tokens: int = 0


def document_scores(request: Request, scored: Scored) -> list[float]:
    """Each document's score: its best window's (a document of one window: that window's, TEI's own score)."""
    best = [-math.inf] * len(request.texts)
    for window, score in zip(scored.windows, scored.scores, strict=True):
        best[window.document] = max(best[window.document], score)
    missing = [i for i, s in enumerate(best) if s == -math.inf]
    if missing:
        raise ValueError(f"documents {missing} were not scored")
    return best


def answer(request: Request, scored: Scored, request_id: str, model_name: str) -> dict[str, Any]:
    """The answer in the request's shape: results by descending score (ties by index), ``top_n`` of them."""
    scores = document_scores(request, scored)
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:request.top_n or len(scores)]
    results = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if request.return_documents:
            original = request.documents[i]
            item["document"] = dict(original) if isinstance(original, dict) else {"text": original}
        results.append(item)
    usage = usage_of(request, scored)
    return {"id": request_id, "results": results, "model": request.model or model_name,
            "meta": {"api_version": {"version": "2" if request.api == "v2" else "1"},
                     "billed_units": {"search_units": usage.search_units}},
            "usage": {"total_tokens": usage.tokens, "prompt_tokens": usage.tokens}}


def usage_of(request: Request, scored: Scored) -> Usage:
    """What answering ``request`` with ``scored`` cost."""
    return Usage(documents=len(request.texts), scored=len(scored.windows), tokens=scored.tokens)


def tei_body(query: str, texts: Sequence[str]) -> bytes:
    """TEI's ``/rerank`` body for a batch: its sigmoid scores (``relevance_score`` is TEI's score), truncated at the
    model's input as TEI's own route is when the pool auto-truncates."""
    return json.dumps({"query": query, "texts": list(texts), "truncate": True, "raw_scores": False},
                      ensure_ascii=False).encode("utf-8")


def tei_scores(answer_body: bytes, count: int) -> list[float]:
    """TEI's ``/rerank`` answer ``[{"index", "score"}]`` as scores in text order; ValueError when it is not that."""
    data = json.loads(answer_body)
    if not isinstance(data, list) or len(data) != count:
        raise ValueError(f"expected a list of {count} results from TEI, got {_kind(data)}")
    scores = [math.nan] * count
    for item in data:
        scores[int(item["index"])] = float(item["score"])
    if any(math.isnan(s) for s in scores):
        raise ValueError("TEI's answer left a text without a score")
    return scores
