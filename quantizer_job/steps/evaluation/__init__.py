"""How a model is judged against FP32: the evaluation and calibration pairs (``evaldata``), the ranking metrics
(``metrics``), scoring under TEI's settings and the quality gate (``verify``), and the speed as a pool serves it
(``serving``)."""
