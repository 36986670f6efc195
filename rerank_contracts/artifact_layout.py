"""Where an artifact lives on the model volume, and what its directory holds.

The Job publishes here, the pools mount it, the guard replays and samples beside it, the shared store packs and
unpacks the same entries. ``root`` is the mount point of the model volume::

    <root>/artifacts/<artifact-id>/            published atomically (rename of a sibling temp dir)
        manifest.json                          files, sha256, recipe, quality, speed, versions, timings
        cpu-int8/   model.onnx config.json tokenizer.json ...   what the CPU pool's TEI mounts
        original/   model.safetensors config.json tokenizer.json ...   what the GPU pool serves in FP16
        evaluation.jsonl                       the pairs the artifact was verified on
    <root>/artifacts/.tmp-<artifact-id>-<random>/   work in progress; never read by TEI
    <root>/samples/<model>/live.jsonl          a guarded model's live sample, with the tenant's consent
"""

from __future__ import annotations

#: Where the model volume is mounted in the Job and in TEI pods.
VOLUME_MOUNT_PATH = "/models"
ARTIFACTS_DIR = "artifacts"
CPU_SUBDIR = "cpu-int8"
ORIGINAL_SUBDIR = "original"
MANIFEST_FILE = "manifest.json"
#: The evaluation pairs the artifact was verified on (JSONL of {"query", "text"}), beside its TEI directories: what
#: the quality guard replays for a model without a Gateway to mirror live requests from.
EVALUATION_FILE = "evaluation.jsonl"
#: With the tenant's consent (``quantization.requantizeOnDrift``) the quality guard keeps a sample of a model's live
#: requests at ``samples/<model>/live.jsonl`` (JSONL of {"query", "texts", "t"}): a re-quantization's evaluation and
#: calibration data.
SAMPLES_DIR = "samples"
LIVE_SAMPLE_FILE = "live.jsonl"


def artifact_dir(root: str, artifact_id: str) -> str:
    """Final path of an artifact on the volume."""
    return f"{root.rstrip('/')}/{ARTIFACTS_DIR}/{artifact_id}"
