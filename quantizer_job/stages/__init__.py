"""The Job's stages, in the order the run (``pipeline.py``) calls them: ``preparation`` (the source fetched and
checked, the pairs loaded, the FP32 export), ``fp32_reference`` (the scores and speed every candidate is measured
against), ``recipe_trials`` (the recipes tried and one chosen), ``artifact_assembly`` (the artifact's directories and
manifest). Below them, what several stages share: ``measurement`` (how every model is scored and timed),
``large_models`` (what a model too large to fuse changes) and ``stage_data`` (what one stage hands the next). A stage
calls the steps (``steps/``) and never the run (an import-linter contract)."""
