"""The short GPU name a bench result file starts with: ``"NVIDIA H200"`` -> ``h200``,
``"NVIDIA H100 80GB HBM3"`` -> ``h100`` (so a run on another card is not filed as an H200
run). Import-free (no torch): the caller passes ``torch.cuda.get_device_name()``."""

from __future__ import annotations

import re


def device_tag(device_name: str) -> str:
    """The first word of the name with a digit in it (the model), lower-case, after the word
    before it when it is all digits (``RTX 4090`` -> ``rtx4090``); else ``gpu``."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", device_name) if w]
    at = next((i for i, w in enumerate(words) if any(c.isdigit() for c in w)), None)
    if at is None:
        return "gpu"
    model = words[at - 1] + words[at] if words[at].isdigit() and at > 0 else words[at]
    return model.lower()
