"""The serving-time quality guard: compares each pool's rankings of sampled live requests with a reference.

- :mod:`.compare`: one request, one pool vs the reference: Spearman, top-k agreement, max score difference and
  whether the pool's scores are broken (non-finite or saturated).
- :mod:`.detector`: per (model, pool), a sequential decision over those figures: below the quality floor with
  confidence, or healthy; hysteresis so a pool never flaps.
- :mod:`.budget`: the per-model budget of extra requests/s (a token bucket) and the sampling fraction.

All three are pure (numpy and the standard library, an injected clock): the process that feeds them is built on top.
:mod:`.server` runs it for one model (:mod:`.config`): :mod:`.intake` lets the mirrored copies in, :mod:`.worker`
checks them one at a time (:mod:`.checks`, asking the pools and a TEI reference through :mod:`.endpoints`, or
:mod:`.reference`: FP32 scores of the original weights in the guard's process, for a model without a GPU pool),
:mod:`.replay` stands in for a missing mirror, :mod:`.metrics` exports the verdicts and :mod:`.sample` keeps the live
sample. docs/quality-guard.md explains the statistics and gives the benchmark's figures.
"""
