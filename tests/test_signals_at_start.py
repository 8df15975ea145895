"""SIGTERM is raysim's from the first second (issue 39): a real SIGTERM while ``ray.init`` starts Ray (before, Ray's
own handler was in place there: exit 15, no message) ends ``raysim run`` with exit 143 and its one line, for a new
run and for ``--resume`` (which names the round checkpointed and the resume command); no Ray stack dump.

The signal is sent by the process to itself from inside ``ray.init`` (once Ray's node is up, the point where Ray's
handler used to be in place), so it always lands in that window."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import tiny_overrides
from raysim.cli import main

pytestmark = pytest.mark.slow

_SELF_TERM = textwrap.dedent("""
    import os, signal, sys
    import ray._private.node as node
    started = node.Node.__init__
    def init(self, *args, **kwargs):
        started(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
    node.Node.__init__ = init
    from raysim.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def _run_terminated(tmp_path, cli_env, args: list[str]) -> str:
    script = tmp_path / "self_term.py"
    script.write_text(_SELF_TERM)
    proc = subprocess.run([sys.executable, str(script), *args], env=cli_env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "SIGTERM received" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("raysim: stopped by SIGTERM"), proc.stderr
    return lines[0]


def test_sigterm_while_ray_starts_is_143_with_the_resume_line(tmp_path, cli_env, capsys):
    """A checkpointed run, resumed on Ray and stopped while Ray starts (a new run takes the same path, and says "no
    round was checkpointed: start the run again")."""
    assert main(["run", *tiny_overrides(tmp_path), "--quiet"]) == 0
    capsys.readouterr()
    line = _run_terminated(tmp_path, cli_env, ["run", "--resume", str(tmp_path / "run"), "rounds=3",
                                               "engine.backend=ray"])
    assert f"round 2 is checkpointed; resume with: raysim run --resume {tmp_path / 'run'}" in line, line
