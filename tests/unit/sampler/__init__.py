"""The sampler's unit tests (operator/rerank_sampler): real sockets, a TEI stand-in and a guard stand-in;
``sampler_helpers`` starts them and speaks HTTP to them."""
