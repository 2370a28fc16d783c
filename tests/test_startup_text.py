"""What app.py prints at startup names its own flags (issue 13 item 13): Gradio's "set share=True in launch()" hint
is not shown; the app's own line points to --share. On a CPU, 4bit says its path in the app's own line, without
bitsandbytes' notice about the `kernels` package."""

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


def startup_output(*flags: str) -> str:
    """What `python app.py --port P --threads 1 *flags` prints until it is serving (and 3 s more)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "app.py", "--port", str(free_port()), "--threads", "1", *flags],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
    return output


def test_startup_points_to_the_share_flag_not_gradios_launch_argument():
    output = startup_output()
    assert "--share" in output and "share=True" not in output, output[-2000:]


def test_4bit_on_a_cpu_says_its_path_once_without_bitsandbytes_kernels_notice():
    pytest.importorskip("bitsandbytes")
    output = startup_output("--device", "cpu", "--quantization", "4bit")
    assert output.count("4bit on the CPU: bitsandbytes NF4") == 1, output[-2000:]
    assert "kernels-community" not in output and "pip install" not in output, output[-2000:]
