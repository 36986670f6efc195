"""The rerank API's shapes as pure functions: what is refused and how it is named, windows, cuts, answers, usage."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rerank_contracts import rerank_api
from rerank_contracts.rerank_api import ApiError, Scored, Window


def body(**fields: Any) -> bytes:
    return json.dumps({"query": "what is a panda?", "documents": ["a bear", "a city"], **fields}).encode()


def refused(raw: bytes, content_type: str | None = "application/json", models: tuple[str, ...] = ("m",)) -> ApiError:
    with pytest.raises(ApiError) as caught:
        rerank_api.parse("v2", raw, content_type, models)
    return caught.value


#: (body, content type, status, what the message must say, the field named)
MALFORMED: list[tuple[bytes, str | None, int, str, str | None]] = [
    (b"", "application/json", 400, "no body", None),
    (b"{", "application/json", 400, "not JSON", None),
    (b"\xff\xfe{}", "application/json", 400, "not UTF-8", None),
    (b'{"query": NaN}', "application/json", 400, "NaN", None),
    (b"[" * 100_000 + b"]" * 100_000, "application/json", 400, "nested too deeply", None),
    (b'"a string"', "application/json", 400, "JSON object, not a string", None),
    (b"[]", "application/json", 400, "JSON object, not an array", None),
    (body(), "text/plain", 415, "text/plain", None),
    (body(), "application/x-www-form-urlencoded", 415, "must be JSON", None),
    (json.dumps({"documents": ["a"]}).encode(), None, 422, "query is required", "query"),
    (json.dumps({"query": 3, "documents": ["a"]}).encode(), None, 422, "query must be a string, not a number", "query"),
    (json.dumps({"query": "  ", "documents": ["a"]}).encode(), None, 422, "query is empty", "query"),
    (json.dumps({"query": "q"}).encode(), None, 422, "documents is required", "documents"),
    (json.dumps({"query": "q", "documents": "a"}).encode(), None, 422, "documents must be an array", "documents"),
    (json.dumps({"query": "q", "documents": []}).encode(), None, 422, "documents is empty", "documents"),
    (json.dumps({"query": "q", "documents": ["a"] * 1001}).encode(), None, 422, "1001 entries; at most 1000",
     "documents"),
    (json.dumps({"query": "q", "documents": ["a", 7]}).encode(), None, 422,
     "documents[1] must be a string or an object", "documents[1]"),
    (json.dumps({"query": "q", "documents": [None]}).encode(), None, 422, "documents[0] must be a string",
     "documents[0]"),
    (json.dumps({"query": "q", "documents": [{"title": "x"}]}).encode(), None, 422, "documents[0] has no text",
     "documents[0].text"),
    (json.dumps({"query": "q", "documents": [{"text": 5}]}).encode(), None, 422, "has text a number, not a string",
     "documents[0].text"),
    (body(top_n=0), None, 422, "top_n must be at least 1, not 0", "top_n"),
    (body(top_n=-3), None, 422, "top_n must be at least 1", "top_n"),
    (body(top_n="2"), None, 422, "top_n must be an integer, not a string", "top_n"),
    (body(top_n=True), None, 422, "top_n must be an integer, not a boolean", "top_n"),
    (body(top_n=1.5), None, 422, "top_n must be an integer, not a number", "top_n"),
    (body(return_documents="yes"), None, 422, "return_documents must be a boolean", "return_documents"),
    (body(max_tokens_per_doc=0), None, 422, "max_tokens_per_doc must be at least 1", "max_tokens_per_doc"),
    (body(max_chunks_per_doc="many"), None, 422, "max_chunks_per_doc must be an integer", "max_chunks_per_doc"),
    (body(model="rerank-english-v3.0"), None, 404, "'rerank-english-v3.0' is not served here", "model"),
    (body(model=["m"]), None, 422, "model must be a string, not an array", "model"),
    (body(rank_fields="title"), None, 422, "rank_fields must be an array of strings", "rank_fields"),
    (json.dumps({"query": "q", "documents": [{"title": 3}], "rank_fields": ["title"]}).encode(), None, 422,
     "documents[0].title (a rank field) must be a string", "documents[0]"),
]


@pytest.mark.parametrize(("raw", "content_type", "status", "said", "field"), MALFORMED,
                         ids=[f"{i}-{m[3][:30]}" for i, m in enumerate(MALFORMED)])
def test_a_malformed_request_is_refused_with_a_4xx_naming_the_problem(
        raw: bytes, content_type: str | None, status: int, said: str, field: str | None) -> None:
    error = refused(raw, content_type)
    assert (error.status, error.field) == (status, field)
    assert said in error.message
    assert error.body()["message"] == error.message  # Cohere's clients read message, Jina's detail
    assert error.body()["detail"] == error.message


def test_documents_are_strings_or_objects_with_text_and_null_options_are_absent() -> None:
    request = rerank_api.parse("v1", json.dumps({
        "query": "q", "documents": ["plain", {"text": "object", "id": 7}], "top_n": None, "return_documents": None,
        "max_tokens_per_doc": None, "model": None}).encode(), "application/json; charset=utf-8", ("m",))
    assert request.texts == ("plain", "object")
    assert (request.top_n, request.return_documents, request.max_tokens_per_doc, request.model) == (
        None, False, None, None)


def test_rank_fields_score_the_named_fields_in_order() -> None:
    request = rerank_api.parse("v1", json.dumps({
        "query": "q", "documents": [{"title": "Pandas", "text": "eat bamboo", "author": "x"}],
        "rank_fields": ["title", "text"]}).encode(), None)
    assert request.texts == ("title: Pandas\ntext: eat bamboo",)


def test_top_n_above_the_documents_is_all_of_them() -> None:
    assert rerank_api.parse("v2", body(top_n=50), None).top_n == 2


def test_the_answer_is_sorted_by_score_with_ties_by_index_and_cut_at_top_n() -> None:
    request = rerank_api.parse("v1", json.dumps({"query": "q", "documents": ["a", {"text": "b", "id": 9}, "c", "d"],
                                                 "top_n": 3, "return_documents": True}).encode(), None)
    scored = Scored(tuple(Window(i, 0, 1) for i in range(4)), (0.2, 0.9, 0.5, 0.9), tokens=40)
    answer = rerank_api.answer(request, scored, "id-1", "m")
    assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == [(1, 0.9), (3, 0.9), (2, 0.5)]
    assert answer["results"][0]["document"] == {"text": "b", "id": 9}  # the object as sent
    assert answer["results"][1]["document"] == {"text": "d"}
    assert answer["meta"]["billed_units"] == {"search_units": 1}
    assert answer["usage"]["total_tokens"] == 40
    assert (answer["id"], answer["model"], answer["meta"]["api_version"]["version"]) == ("id-1", "m", "1")


def test_a_document_of_several_windows_scores_its_best_and_each_window_is_billed() -> None:
    request = rerank_api.parse("v2", body(), None)
    windows = (Window(0, 0, 5), Window(0, 4, 9), Window(1, 0, 3), *tuple(Window(1, 0, 3) for _ in range(100)))
    scores = (0.1, 0.8, 0.3, *tuple(0.2 for _ in range(100)))
    answer = rerank_api.answer(request, Scored(windows, scores), "x", "m")
    assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == [(0, 0.8), (1, 0.3)]
    assert "document" not in answer["results"][0]
    assert answer["meta"]["billed_units"]["search_units"] == 2  # 103 texts scored


def test_a_document_left_unscored_is_an_error_not_a_silent_minus_infinity() -> None:
    with pytest.raises(ValueError, match=r"documents \[1\]"):
        rerank_api.document_scores(rerank_api.parse("v2", body(), None), Scored((Window(0, 0, 1),), (0.5,)))


def test_a_text_no_longer_in_bytes_than_the_bound_is_never_tokenized() -> None:
    assert not rerank_api.may_exceed("a" * 512, 512)
    assert rerank_api.may_exceed("a" * 513, 512)
    assert rerank_api.may_exceed("熊" * 200, 512)  # 600 bytes


@given(n=st.integers(1, 3000), size=st.integers(16, 600), limit=st.none() | st.integers(1, 20))
def test_windows_cover_the_document_in_order_overlapping_and_within_size(n: int, size: int,
                                                                         limit: int | None) -> None:
    spans = [(i * 3, i * 3 + 2) for i in range(n)]  # "xx xx xx ..."
    length = n * 3 - 1
    got = rerank_api.windows(7, spans, size, limit, length)
    assert all(w.document == 7 for w in got)
    if n <= size:
        assert got == [Window(7, 0, length)]
        return
    assert got[0].start == 0
    assert all(len([s for s in spans if w.start <= s[0] and s[1] <= w.end]) <= size for w in got)
    assert all(a.start < b.start < a.end for a, b in itertools.pairwise(got))  # overlapping, advancing
    if limit is None or len(got) < limit:
        assert got[-1].end == length  # the end of the document is in a window
    else:
        assert len(got) == limit


def test_a_window_of_utf8_bytes_decodes_to_its_words() -> None:
    text = "héllo wörld 熊猫 bamboo".encode()
    assert Window(0, 7, 20).of(text) == "wörld 熊猫"


def test_a_cut_ends_at_the_last_kept_tokens_end() -> None:
    spans = [(0, 5), (6, 11), (12, 20)]
    assert rerank_api.cut(spans, 2, 20) == 11
    assert rerank_api.cut(spans, 3, 20) == 20
    assert rerank_api.cut(spans, 9, 20) == 20


def test_teis_answer_is_read_in_text_order_and_a_short_one_is_refused() -> None:
    assert rerank_api.tei_scores(b'[{"index":1,"score":0.9},{"index":0,"score":0.1}]', 2) == [0.1, 0.9]
    with pytest.raises(ValueError, match="list of 3"):
        rerank_api.tei_scores(b'[{"index":1,"score":0.9},{"index":0,"score":0.1}]', 3)
    with pytest.raises(ValueError, match="without a score"):
        rerank_api.tei_scores(b'[{"index":1,"score":0.9},{"index":1,"score":0.1}]', 2)
