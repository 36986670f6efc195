"""The serving-time quality guard: compares each pool's rankings of sampled live requests with a reference.

- :mod:`.compare`: one request, one pool vs the reference: Spearman, top-k agreement, max score difference and
  whether the pool's scores are broken (non-finite or saturated).
- :mod:`.detector`: per (model, pool), a sequential decision over those figures: below the quality floor with
  confidence, or healthy; hysteresis so a pool never flaps.
- :mod:`.budget`: the per-model budget of extra requests/s (a token bucket) and the sampling fraction.

All three are pure (numpy and the standard library, an injected clock): the server that feeds them is built on top,
with :mod:`.reference` (FP32 scores of the original weights in the guard's process, for a model without a GPU pool).
docs/quality-guard.md explains the statistics and gives the benchmark's figures.
"""
