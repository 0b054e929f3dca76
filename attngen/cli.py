"""Command line: ``python -m attngen validate PATH...``, ``python -m attngen generate`` and
``python -m attngen review [BASE]``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from attngen.emit.header import regenerate_command
from attngen.generate import (
    ALL_ARCHS,
    GenerateError,
    find_specs,
    generate,
    log,
    misplaced,
    tree_label,
    warn_many_variants,
)
from attngen.emit.writer import DuplicateWrite
from attngen.ir import PlanError
from attngen.review import add_parser as add_review_parser
from attngen.spec.errors import SpecError
from attngen.spec.loader import load_spec
from attngen.spec.model import Spec
from attngen.validate import check_plans, not_lowered, validate

REPO_ROOT = Path(__file__).resolve().parent.parent


def cmd_validate(args: argparse.Namespace) -> int:
    """Every spec file of the paths, as generate would load them (one discovery rule, spec
    names unique across them), each reported once; exit 1 if any fails. A spec file named
    on its own (not found in a folder) must also not reuse a name of the repository's
    specs/, which generate would load next to it."""
    failed, names, done = 0, Names(), set[Path]()
    for raw in args.paths:
        try:
            paths = find_specs(raw)
        except GenerateError as err:
            print(f"error: {err}", file=sys.stderr)
            failed += 1
            continue
        named = Path(raw).is_file()  # a file named on its own, not found in a folder
        for path in paths:
            if path.resolve() not in done:
                done.add(path.resolve())
                failed += _validate_file(path, names, against_repo=named)
    return 1 if failed else 0


class Names:
    """Spec names already taken: by the files validated so far and (loaded when first
    asked) by the repository's specs/."""

    def __init__(self) -> None:
        self.validated: dict[str, str] = {}
        self._repo: dict[str, tuple[Path, str]] | None = None

    def clash(self, spec: Spec, path: Path, against_repo: bool) -> str | None:
        """The spec file that already uses ``spec``'s name, if any."""
        if spec.name in self.validated:
            return self.validated[spec.name]
        if against_repo:
            owner = self.repo().get(spec.name)
            if owner is not None and owner[0] != path.resolve():
                return owner[1]
        return None

    def repo(self) -> dict[str, tuple[Path, str]]:
        """name -> (resolved path, shown path) of every spec under specs/ that loads."""
        if self._repo is None:
            self._repo = {}
            folder = REPO_ROOT / "specs"
            for path in find_specs(folder) if folder.is_dir() else []:
                try:
                    spec = load_spec(path, Path.cwd())
                except (SpecError, OSError):
                    continue  # its own validation reports it; here only names count
                self._repo.setdefault(spec.name, (path.resolve(), spec.path))
        return self._repo


def _validate_file(path: Path, names: Names, against_repo: bool) -> int:
    try:
        spec = load_spec(path, Path.cwd())
        owner = names.clash(spec, path, against_repo)
        if owner is not None:
            raise SpecError(spec.location, "name", f"{spec.name!r} is already used by {owner}")
        names.validated[spec.name] = spec.path
        variants = validate(spec)
        check_plans(spec, variants)  # what generate would refuse at lowering
    except SpecError as err:
        print(err, file=sys.stderr)
        return 1
    except OSError as err:
        print(f"error: {path}: cannot read: {err.strerror or err}", file=sys.stderr)
        return 1
    warning = misplaced(spec)
    if warning:
        log(warning)
    warn_many_variants(spec, len(variants))
    print(f"{path}: ok ({len(variants)} variants)")
    for line in not_lowered(spec, variants):
        print(f"{path}: note: {line}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    archs = ALL_ARCHS if args.arch == "all" else (args.arch,)
    try:
        # the path as given: find_specs refuses an empty one (Path("") would be the cwd)
        drift = generate(REPO_ROOT, args.specs, Path(args.out), archs, check=args.check)
    except (SpecError, PlanError, DuplicateWrite, GenerateError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # writing the tree (a spec that cannot be read is a GenerateError)
        print(f"error: {err.filename}: {err.strerror or err}", file=sys.stderr)
        return 1
    out = Path(args.out)
    tree = tree_label(REPO_ROOT, out)
    if args.check and not drift.clean:  # every arch is checked, whichever was asked for
        again = regenerate_command("all")
        if tree != "generated/":
            again = f"python -m attngen generate --arch all --out {out}"
        print(drift.report(again, tree), file=sys.stderr)
        return 1
    if args.check:
        log(f"{tree} is up to date for {', '.join(ALL_ARCHS)} and the docs")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attngen", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check spec files; print file:line errors")
    v.add_argument("paths", nargs="+", help="spec files or directories")
    v.set_defaults(func=cmd_validate)
    g = sub.add_parser("generate", help="lower specs into generated/")
    g.add_argument("--arch", choices=[*ALL_ARCHS, "all"], default="all")
    g.add_argument(
        "--specs", default=str(REPO_ROOT / "specs"), help="spec directory (default: specs/)"
    )
    g.add_argument(
        "--out", default=str(REPO_ROOT / "generated"), help="output directory (default: generated/)"
    )
    g.add_argument("--check", action="store_true", help="write nothing; fail if the tree differs")
    g.set_defaults(func=cmd_generate)
    add_review_parser(sub, REPO_ROOT)
    return p


# Exit statuses a shell gives a command ended by SIGINT (Ctrl-C) or SIGPIPE (its reader gone)
INTERRUPTED, BROKEN_PIPE = 130, 141


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:  # generate replaces each file in one step: none is cut short
        print("attngen: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # `attngen validate specs | head`: the rest has no reader
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the flush at exit must not fail again
        return BROKEN_PIPE
