"""Run inside the official clients' own environment (``official.py``): each client reranks the same documents
against ``base_url`` and the results are printed as JSON, ``{client: [[index, score], ...]}`` in the client's order.

    python call.py BASE_URL API_KEY MODEL < {"query": ..., "documents": [...], "top_n": N}
"""

import json
import sys


def main() -> None:
    base_url, api_key, model = sys.argv[1:4]
    job = json.load(sys.stdin)
    query, documents, top_n = job["query"], job["documents"], job["top_n"]
    out = {}

    import cohere

    v1 = cohere.Client(api_key=api_key, base_url=base_url)
    answer = v1.rerank(model=model, query=query, documents=documents, top_n=top_n, return_documents=True)
    out["cohere.Client.rerank"] = [[r.index, r.relevance_score, r.document.text] for r in answer.results]
    v2 = cohere.ClientV2(api_key=api_key, base_url=base_url)
    answer = v2.rerank(model=model, query=query, documents=documents, top_n=top_n)
    out["cohere.ClientV2.rerank"] = [[r.index, r.relevance_score] for r in answer.results]

    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(client=v2, model=model, top_n=top_n)
    ranked = reranker.compress_documents([Document(page_content=d, metadata={"i": i})
                                          for i, d in enumerate(documents)], query)
    out["langchain_cohere.CohereRerank"] = [[d.metadata["i"], d.metadata["relevance_score"]] for d in ranked]

    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank as LlamaCohereRerank

    post = LlamaCohereRerank(api_key=api_key, model=model, top_n=top_n, base_url=base_url)
    nodes = [NodeWithScore(node=TextNode(text=d, id_=str(i))) for i, d in enumerate(documents)]
    kept = post.postprocess_nodes(nodes, query_bundle=QueryBundle(query))
    out["llama_index.CohereRerank"] = [[int(n.node.id_), n.score] for n in kept]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
