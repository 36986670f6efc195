"""The operator's side of quality: what it makes of the quality guard's verdicts (``assessment``: the Quality
condition, which pool is below the floor, the canary's verdict), when a drifting model is re-quantized on its live
sample (``requantize``), and how a new artifact reaches traffic as a canary (``canary``). Pure. The guard itself is a
separate process (``quality_guard/``); its Deployment is built by ``builders/guard.py`` and its verdicts are read by
``adapters/guard_scrape.py``."""
