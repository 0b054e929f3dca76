"""Host-side checks shared by the launchers of Gluon kernels (Triton's layout-explicit
dialect), whichever family's they are."""

from __future__ import annotations

import os

from attngen.runtime.checks import fail


def refuse_interpreter(field: str) -> None:
    """Raise AttngenInputError naming ``field`` (the config switch that picked a Gluon
    kernel) when TRITON_INTERPRET=1: the Triton interpreter cannot run Gluon."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        fail(field, "0 under TRITON_INTERPRET (Gluon needs an sm90 GPU)", 1)
