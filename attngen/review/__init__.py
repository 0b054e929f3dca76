"""``python -m attngen review [BASE]``: what a change does, for the reviewer of a spec PR.

Compares BASE (a git revision; default: the merge base of HEAD and main) with the working
tree: specs added, changed and removed; per spec the variants added and removed per backend
x arch and the variants refused with the capability model's reason; the support-matrix
cells that change and why; kernel code that changed and the evidence it drops; the commands
that restore the evidence; the size of the generated diff by kind.

- :mod:`.snapshot`: one side's model (run on that side's own code, spine only);
- :mod:`.sides`: BASE unpacked with ``git archive``, both snapshots, git file facts;
- :mod:`.compare`: specs, variants, identities; :mod:`.cells`: matrix cells and why they
  move; :mod:`.variants`: how one variant changed; :mod:`.files`: file kinds; :mod:`.todo`:
  commands;
- :mod:`.report`: text, Markdown and JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_LOSS = 1  # --fail-on-evidence-loss tripped, or a spec of the working tree is refused
EXIT_ERROR = 2  # the review could not run


def add_parser(sub: argparse._SubParsersAction, repo_root: Path) -> None:
    r = sub.add_parser(
        "review",
        help="what a change does: variants, matrix cells, evidence, commands to run",
        description=__doc__.split("\n\n")[1],
    )
    r.add_argument("base", nargs="?", help="git revision (default: merge base of HEAD and main)")
    r.add_argument("--format", choices=("text", "md", "json"), default="text")
    r.add_argument(
        "--fail-on-evidence-loss",
        action="store_true",
        help="exit 1 when a verified or compiles cell falls back",
    )
    r.add_argument("--repo", default=str(repo_root), help="repository (default: this one)")
    r.set_defaults(func=cmd_review)


def cmd_review(args: argparse.Namespace) -> int:
    from attngen.review.report import RENDERERS, build
    from attngen.review.sides import ReviewError, load_sides

    try:
        report = build(load_sides(Path(args.repo), args.base))
    except ReviewError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    sys.stdout.write(RENDERERS[args.format](report))
    if report.review.errors:
        print(f"error: {len(report.review.errors)} spec(s) are refused", file=sys.stderr)
        return EXIT_LOSS
    loss = report.review.evidence_loss
    if args.fail_on_evidence_loss and loss:
        print(
            f"error: {len(loss)} support-matrix cells fall back (--fail-on-evidence-loss)",
            file=sys.stderr,
        )
        return EXIT_LOSS
    return 0
