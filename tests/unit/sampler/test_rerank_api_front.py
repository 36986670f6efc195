"""The pods' front answering the Cohere and Jina shapes through TEI's routes: the real front on real ports, before a
TEI stand-in that scores by words (``tests/tei_words.py``) so that each expected score is TEI's own for the pair."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from rerank_devcluster.waiting import eventually
from rerank_sampler import server
from rerank_sampler.translation import ApiSettings
from tests.clients import official
from tests.tei_words import WordTei
from tests.unit.contracts.test_rerank_api_shapes import MALFORMED
from tests.unit.sampler.sampler_helpers import TOKEN, Guard, Tei, call, samples

QUERY = "where do giant pandas live"
DOCUMENTS = ["Giant pandas live in the mountains of central China.", "Paris is the capital of France.",
             "Pandas eat bamboo.", "The giant panda is a bear.", "Where do you live?", "Mountains of China.",
             "Live music in Paris.", "Bamboo forests are where pandas live."]


@contextlib.contextmanager
def front(tei: WordTei, long_documents: str = "truncate", guard_url: str | None = None,
          fraction: float = 0.0) -> Iterator[server.Running]:
    api = ApiSettings(models=("minilm", "search/minilm", "BAAI/bge-reranker-v2-m3"), served_model="minilm",
                      long_documents=long_documents)  # type: ignore[arg-type]
    running = server.start(server.Settings(guard_url=guard_url, token=TOKEN, fraction=fraction, api=api,
                                           upstream=tei.url, seed=1))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def tei() -> Iterator[WordTei]:
    stand_in = WordTei(max_input=64, max_batch=3)
    yield stand_in
    stand_in.stop()


def post(running: server.Running, path: str, payload: Any, headers: dict[str, str] | None = None
         ) -> tuple[int, Any]:
    reply = call(running.url, "POST", path, {"Content-Type": "application/json", **(headers or {})},
                 json.dumps(payload).encode())
    return reply.status, json.loads(reply.body)


def teis_own(running: server.Running, query: str, texts: list[str]) -> dict[int, float]:
    """TEI's /rerank through the same front, one text at a time (within its batch limit): index -> score."""
    out = {}
    for i, text in enumerate(texts):
        status, answer = post(running, "/rerank", {"query": query, "texts": [text], "truncate": True})
        assert status == 200
        out[i] = answer[0]["score"]
    return out


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_each_shape_ranks_every_document_with_teis_own_scores_across_teis_batches(tei: WordTei, path: str) -> None:
    with front(tei) as running:
        status, answer = post(running, path, {"model": "minilm", "query": QUERY, "documents": DOCUMENTS})
        expected = teis_own(running, QUERY, DOCUMENTS)
    assert status == 200
    got = [(r["index"], r["relevance_score"]) for r in answer["results"]]
    assert sorted(i for i, _ in got) == list(range(len(DOCUMENTS)))
    assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    for index, score in got:
        assert score == pytest.approx(expected[index], abs=1e-9)
    assert got[0][0] == 0  # the one document holding every word of the query
    assert tei.calls["/rerank"] == 3 + len(DOCUMENTS)  # 8 documents in TEI batches of at most 3, then one by one
    assert answer["meta"]["api_version"]["version"] == path[2]
    assert answer["meta"]["billed_units"]["search_units"] == 1
    assert answer["usage"]["total_tokens"] > 0 and answer["model"] == "minilm"


def test_top_n_and_return_documents_as_cohere_v1_and_jina_give_them(tei: WordTei) -> None:
    documents = [{"text": d, "id": f"doc-{i}"} if i % 2 else d for i, d in enumerate(DOCUMENTS)]
    with front(tei) as running:
        status, answer = post(running, "/v1/rerank", {"model": "BAAI/bge-reranker-v2-m3", "query": QUERY,
                                                      "documents": documents, "top_n": 3, "return_documents": True})
    assert status == 200 and len(answer["results"]) == 3
    for result in answer["results"]:
        sent = documents[result["index"]]
        assert result["document"] == (sent if isinstance(sent, dict) else {"text": sent})
    assert answer["model"] == "BAAI/bge-reranker-v2-m3"


def test_each_of_the_malformed_requests_gets_its_4xx_from_the_front_and_tei_sees_none(tei: WordTei) -> None:
    """The contract's 32 malformed requests (tests/unit/contracts/test_rerank_api_shapes.py) sent to the real front:
    each answered with its status and a message naming the problem; TEI is never called."""
    with front(tei) as running:
        answers = []
        for raw, content_type, _, _, _ in MALFORMED:
            headers = {"Content-Type": content_type} if content_type else {}
            reply = call(running.url, "POST", "/v2/rerank", headers, raw)
            answers.append((reply.status, json.loads(reply.body)))
    assert [status for status, _ in answers] == [m[2] for m in MALFORMED]
    assert all(said in body["message"] and body.get("field") == field
               for (_, body), (_, _, _, said, field) in zip(answers, MALFORMED, strict=True))
    assert sum(tei.calls.values()) == 0


def test_a_malformed_request_never_reaches_tei_and_is_counted(tei: WordTei) -> None:
    bad: list[Any] = [{"query": "q"}, {"query": "q", "documents": []}, {"query": "", "documents": ["a"]},
                      {"query": "q", "documents": ["a"], "top_n": 0}, {"query": "q", "documents": [1]},
                      {"model": "gpt-4", "query": "q", "documents": ["a"]}, ["not", "an", "object"]]
    with front(tei) as running:
        statuses = [post(running, "/v2/rerank", payload)[0] for payload in bad]
        reply = call(running.url, "POST", "/v2/rerank", {"Content-Type": "application/json"}, b"{nope")
        too_big = call(running.url, "POST", "/v1/rerank",  # refused on its stated length, before the body
                       {"Content-Type": "application/json", "Content-Length": str(3 * 1024 * 1024)}, None)
        metrics = samples(running.metrics_url)
    assert statuses == [422, 422, 422, 422, 422, 404, 400]
    assert reply.status == 400 and "not JSON" in json.loads(reply.body)["message"]
    assert too_big.status == 413
    assert tei.calls["/rerank"] == 0 and tei.calls["/tokenize"] == 0
    assert metrics["rerank_api_requests_total", (("api", "v2"), ("outcome", "invalid"))] == 8


def test_max_tokens_per_doc_cuts_a_document_before_it_is_scored(tei: WordTei) -> None:
    long = "filler " * 20 + "giant pandas live here"
    with front(tei) as running:
        _, whole = post(running, "/v2/rerank", {"query": QUERY, "documents": [long]})
        _, cut = post(running, "/v2/rerank", {"query": QUERY, "documents": [long], "max_tokens_per_doc": 20})
        expected_cut = teis_own(running, QUERY, [" ".join(["filler"] * 20)])[0]
    assert whole["results"][0]["relevance_score"] == pytest.approx(tei.score(QUERY, long))
    assert cut["results"][0]["relevance_score"] == pytest.approx(expected_cut)
    assert cut["results"][0]["relevance_score"] < whole["results"][0]["relevance_score"]
    assert tei.calls["/tokenize"] == 1  # only the request that asked for a cut, only the long document


def test_the_chunked_mode_finds_a_relevant_passage_past_the_models_input(tei: WordTei) -> None:
    """A 300-word document whose answer is at its end: truncated, TEI never sees it and it ranks last; chunked, its
    best window holds it and it ranks first, scored as TEI scores that window."""
    buried = " ".join(f"word{i}" for i in range(300)) + " giant pandas live in China"
    documents = ["Pandas eat bamboo.", buried, "Paris is the capital of France."]
    with front(tei, "truncate") as running:
        _, truncated = post(running, "/v2/rerank", {"query": QUERY, "documents": documents})
    with front(tei, "chunk") as running:
        _, chunked = post(running, "/v2/rerank", {"query": QUERY, "documents": documents})
    scores = {r["index"]: r["relevance_score"] for r in truncated["results"]}
    assert scores[1] == min(scores.values()) < scores[0]
    assert chunked["results"][0]["index"] == 1
    room = 64 - 5 - 4  # the model's input, the query's words, the pair's special tokens
    assert chunked["results"][0]["relevance_score"] == pytest.approx(
        tei.score(QUERY, " ".join(buried.split()[-room:])))
    windows = len(range(0, 305 - room + (room - room // 4), room - room // 4))
    assert chunked["meta"]["billed_units"]["search_units"] == 1
    assert chunked["usage"]["total_tokens"] > truncated["usage"]["total_tokens"]
    scored = [b for b in tei.bodies if "texts" in b]
    assert sum(len(b["texts"]) for b in scored[-((2 + windows + 2) // 3):]) == 2 + windows


def test_the_key_goes_to_tei_which_refuses_a_wrong_one(tei: WordTei) -> None:
    tei.api_key = "sekret"
    with front(tei) as running:
        wrong, refusal = post(running, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS},
                              {"Authorization": "Bearer nope"})
        right, answer = post(running, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS},
                             {"Authorization": "Bearer sekret"})
    assert wrong == 401 and "refused" in refusal["message"]
    assert right == 200 and len(answer["results"]) == len(DOCUMENTS)


def test_usage_is_counted_per_shape_on_the_fronts_metrics(tei: WordTei) -> None:
    with front(tei, "chunk") as running:
        post(running, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
        post(running, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS[:2]})
        post(running, "/v2/rerank", {"query": QUERY, "documents": ["x " * 200]})
        metrics = samples(running.metrics_url)
    assert metrics["rerank_api_requests_total", (("api", "v1"), ("outcome", "answered"))] == 1
    assert metrics["rerank_api_requests_total", (("api", "v2"), ("outcome", "answered"))] == 2
    assert metrics["rerank_api_documents_total", (("api", "v2"),)] == 3
    assert metrics["rerank_api_scored_texts_total", (("api", "v2"),)] > 3  # the long one in windows
    assert metrics["rerank_api_search_units_total", (("api", "v1"),)] == 1
    assert metrics["rerank_api_tokens_total", (("api", "v1"),)] > 0


def test_a_guarded_fronts_sample_of_the_api_is_what_tei_scored_in_teis_shape(tei: WordTei) -> None:
    guard = Guard()
    try:
        with front(tei, guard_url=guard.url, fraction=1.0) as running:
            post(running, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS})
            eventually(lambda: guard.count() >= 3 or None, 10, "three copies at the guard")
        copies = list(guard.received)
    finally:
        guard.stop()
    assert [c.path for c in copies] == ["/rerank"] * 3
    sent = [json.loads(c.body) for c in copies]
    assert [t for s in sent for t in s["texts"]] == DOCUMENTS
    assert all(c.header("X-Rerank-Mirror-Token") == [TOKEN] for c in copies)


def test_the_official_clients_unmodified_but_for_their_base_url_get_teis_ranking(tei: WordTei) -> None:
    """cohere (v1 and v2), langchain-cohere's CohereRerank and llama-index's CohereRerank, from PyPI, each reranks
    through the front; every one gets TEI's own scores for the pairs, in TEI's order, cut at top_n."""
    with front(tei) as running:
        expected = teis_own(running, QUERY, DOCUMENTS)
        got = official.rerank(running.url, "minilm", QUERY, DOCUMENTS, top_n=4)
    best = sorted(expected, key=lambda i: (-expected[i], i))[:4]
    assert set(got) == {"cohere.Client.rerank", "cohere.ClientV2.rerank", "langchain_cohere.CohereRerank",
                        "llama_index.CohereRerank"}
    for client, ranking in got.items():
        assert [r[0] for r in ranking] == best, client
        for index, score, *text in ranking:
            assert score == pytest.approx(expected[index], abs=1e-5), client
            assert text in ([], [DOCUMENTS[index]]), client


def test_a_model_server_that_is_not_tei_gets_a_502_not_a_dropped_connection(tei: WordTei) -> None:
    """An upstream whose /info is not TEI's (or that is down) is the server's fault: 502 with a message, counted."""
    with front(tei) as running:
        tei.stop()  # down: nothing listens
        down, said = post(running, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS})
    other = Tei()  # answers 404 to /info: not TEI's routes
    try:
        with front(other) as running:  # type: ignore[arg-type]
            wrong, what = post(running, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS})
            metrics = samples(running.metrics_url)
    finally:
        other.stop()
    odd = WordTei()
    odd.max_input = "many"  # type: ignore[assignment]  # an /info that is not TEI's shape
    try:
        with front(odd) as running:
            garbled, told = post(running, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
            odd_metrics = samples(running.metrics_url)
    finally:
        odd.stop()
    assert down == 502 and "no usable answer" in said["message"]
    assert wrong == 404 and "refused" in what["message"]  # TEI's 4xx is passed on as TEI said it
    assert metrics["rerank_api_requests_total", (("api", "v2"), ("outcome", "invalid"))] == 1
    assert garbled == 502 and "not in TEI's shape" in told["message"]
    assert odd_metrics["rerank_api_requests_total", (("api", "v1"), ("outcome", "upstream_error"))] == 1
