"""``python -m attngen.aot --arch ARCH [--out-dir DIR] [...]``: the ahead-of-time compile
check of every generated kernel of an arch, no GPU needed, one backend at a time.

Each registered backend with a compile check (``BackendInfo.aot_main``) runs over its part
of generated/<arch>/<backend>/ and, with ``--out-dir``, writes
``DIR/<backend>/<arch>.json`` (what ``attngen.evidence.load_compile`` reads); with
``--reuse`` too, kernels whose identity and compiler equal a row of that file keep it instead
of compiling again (see :mod:`attngen.aot_driver`). Other arguments go to every backend's
check unchanged. Exits non-zero if any backend's does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attngen import registry
from attngen.evidence import compile_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attngen.aot", description=__doc__)
    parser.add_argument("--arch", required=True)
    parser.add_argument("--out-dir", type=Path, help="write DIR/<backend>/<arch>.json")
    parser.add_argument(
        "--reuse", action="store_true", help="keep --out-dir's rows of unchanged kernels"
    )
    args, rest = parser.parse_known_args(argv)
    status = 0
    for backend, info in sorted(registry.backends().items(), key=lambda kv: kv[0].value):
        if info.aot_main is None:
            continue
        extra = []
        if args.out_dir:
            out = args.out_dir / compile_file(backend.value, args.arch)
            extra = ["--out", str(out)] + (["--reuse", str(out)] if args.reuse else [])
        elif args.reuse:
            parser.error("--reuse needs --out-dir (the evidence it reuses)")
        print(f"== {backend.value} {args.arch}", file=sys.stderr, flush=True)
        status = max(status, info.aot_main(["--arch", args.arch, *extra, *rest]))
    return status


if __name__ == "__main__":
    sys.exit(main())
