"""What app.py prints at startup names its own flags (issue 13 item 13): Gradio's "set share=True in launch()" hint
is not shown; the app's own line points to --share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pages import free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def test_startup_points_to_the_share_flag_not_gradios_launch_argument():
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "app.py", "--port", str(free_port()), "--threads", "1"], cwd=REPO,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "--share" in line:
                time.sleep(3)  # anything Gradio prints while it starts would follow now
                break
    finally:
        process.terminate()
        rest, _ = process.communicate(timeout=30)
    output = "".join(lines) + (rest or "")
    assert "local URL http://127.0.0.1:" in output, output[-2000:]
    assert "--share" in output and "share=True" not in output, output[-2000:]
