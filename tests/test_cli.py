"""How the command line ends when its reader goes away or the user presses Ctrl-C: an exit
status and one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from attngen import cli
from attngen.testing.paths import REPO_ROOT as ROOT


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """`attngen validate specs | head -1`: before, a BrokenPipeError traceback and exit 1
    (read as "a spec failed"); now no traceback and 141, a shell's status for SIGPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        result = subprocess.run(
            [sys.executable, "-m", "attngen", "validate", "specs"],
            cwd=ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    assert result.returncode == 141


def test_ctrl_c_is_one_line_and_status_130(monkeypatch, capsys) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "generate", interrupted)
    assert cli.main(["generate", "--check"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("attngen: interrupted") and "Traceback" not in err
