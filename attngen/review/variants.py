"""A side's lowered variants as the review compares them: their key, their target, how one
changed between the sides (kernel code, config, host code) and the evidence it has."""

from __future__ import annotations

VariantKey = tuple[str, str, str, str]  # spec, backend, arch, uri


def key(row: dict) -> VariantKey:
    return row["spec"], row["backend"], row["arch"], row["uri"]


def rows(snap: dict) -> dict[VariantKey, dict]:
    return {key(r): r for r in snap["variants"]}


def target(row: dict) -> str:
    return f"{row['backend']} {row['arch']}"


def target_order(t: str) -> tuple[str, int]:
    backend, arch = t.split(" ")
    digits = "".join(ch for ch in arch if ch.isdigit())
    return backend, int(digits) if digits else 0


def change(old: dict, new: dict) -> str | None:
    """How a variant generated on both sides changed: its kernel identity by kernel code
    (same config) or by its config, or only its package's runtime identity (host code a GPU
    check runs; '' on revisions without runtime identities); None when neither moved."""
    if old["identity"] != new["identity"]:
        return "kernel_code" if old["config"] == new["config"] else "config"
    runtimes = old.get("runtime", ""), new.get("runtime", "")
    if all(runtimes) and runtimes[0] != runtimes[1]:
        return "runtime_code"
    return None


def evidence_of(row: dict) -> frozenset[str]:
    return frozenset(row["gpu"]) | ({"<compiles>"} if row["compiles"] else frozenset())


def has_evidence(row: dict) -> bool:
    return bool(row["gpu"]) or row["compiles"]
