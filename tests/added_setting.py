"""A copy of the code with two settings more, exercised as a visitor, a client and a user of the command line would,
for tests/test_extending.py (run as a script, in its own process, on that copy):

    PYTHONPATH=<copy> python tests/added_setting.py OLD_TRACE FOLDER

The copy's `engine/settings.py` has two more rows in `SETTINGS` and two more fields in `DiffusionSettings` (`NEW`:
a number and a flag) and nothing else changed. This builds the command line's parser and runs `generate` with the
new flags, builds the app and calls Generate's check step and `/export` with the new values, and reads OLD_TRACE (a
trace written by the code without them) as a file and as the Playground's upload. It writes what it found to
FOLDER/report.json, one JSON object the test asserts on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import engine  # noqa: E402
from diffgemma_ui import build_app  # noqa: E402
from diffgemma_ui.hub import RUN_INPUT_NAMES  # noqa: E402
from diffgemma_ui.session import SessionState  # noqa: E402
from engine import DEFAULT_MODEL, DiffusionEngine, DiffusionSettings, load_model  # noqa: E402
from engine.cli import build_parser  # noqa: E402
from engine.cli import main as cli_main  # noqa: E402
from engine.settings import SETTING_NAMES, spec  # noqa: E402
from engine.trace import load_trace  # noqa: E402

NEW = {"noise_floor": 0.25, "tie_shuffle": True}  # the added settings, each with a value other than its default
ENDPOINTS = ("generate", "export", "race", "chat", "infill")
RUN = {"prompt": "In the beginning", "raw": True, "max_new_tokens": 8, "max_denoising_steps": 1, "seed": 1}


def settings_of(values) -> dict:
    """The added settings of `values` (a mapping or an object with them as attributes)."""
    return {name: values[name] if isinstance(values, dict) else getattr(values, name) for name in NEW}


def main(old_trace: Path, folder: Path) -> None:
    report = {"engine": engine.__file__, "setting_names": list(SETTING_NAMES),
              "defaults": settings_of(DiffusionSettings())}
    flags = ["--noise-floor", str(NEW["noise_floor"]), "--tie-shuffle"]
    report["cli_args"] = settings_of(vars(build_parser().parse_args(["generate", "--prompt", "x", *flags])))
    written = folder / "cli-trace.json"
    report["cli_status"] = cli_main(["generate", "--prompt", RUN["prompt"], "--raw", "--device", "cpu", "--seed", "1",
                                     "--max-new-tokens", "8", "--steps", "1", *flags, "--trace", str(written),
                                     "--json"])
    report["cli_trace"] = settings_of(json.loads(written.read_text(encoding="utf-8"))["settings"])

    model = DiffusionEngine(load_model(DEFAULT_MODEL, device="cpu"))
    app = build_app(model)
    report["controls"] = {name: [type(block).__name__ for block in app.blocks.values()
                                 if getattr(block, "label", None) == spec(name).label] for name in NEW}
    handlers = {dep.api_name: dep.fn for dep in app.fns.values() if dep.api_name in ENDPOINTS}
    report["endpoint_parameters"] = {name: list(inspect.signature(fn).parameters) for name, fn in handlers.items()}
    generate = next(block._id for block in app.blocks.values() if getattr(block, "elem_id", None) == "dg-generate")
    check = next(dep for dep in app.fns.values()
                 if dep.fn is not None and (generate, "click") in map(tuple, dep.targets))
    report["generate_inputs"] = [getattr(block, "label", None) for block in check.inputs]

    tab, session = app.tabs["playground"], SessionState()
    values = {**{name: getattr(model.recommended, name) for name in SETTING_NAMES}, **RUN, **NEW, "thinking": False}
    tab.request_run(session, *(values[name] for name in RUN_INPUT_NAMES))
    report["checked_request"] = settings_of(session.pending[1].settings)
    exported = asyncio.run(handlers["export"](**RUN, **NEW))
    report["exported"] = settings_of(exported["settings"])

    report["old_trace"] = settings_of(load_trace(old_trace).settings)
    uploaded = SessionState()
    tab.keep.check_upload(uploaded, str(old_trace))  # the upload's check step, then its load step
    message, text, *_ = tab.keep.load_upload(uploaded, str(old_trace))
    report["uploaded"] = settings_of(json.loads(message)["settings"])
    report["uploaded_text"] = text
    (folder / "report.json").write_text(json.dumps(report), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
