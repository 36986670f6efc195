"""What TEI needs and does: the model directory it loads, its checks and the manifest (``layout``,
docs/tei-contract.md), and how it tokenizes a query/text pair (``textenc``)."""
