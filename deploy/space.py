"""Write a deployable Hugging Face Space folder for one target (`deploy.targets`).

The folder holds the app (`app.py`, `engine/`, `diffgemma_ui/`, `assets/`, the embedded model only where it is
served), a `README.md` whose front matter configures the Space, a `requirements.txt` for the target, and
`space_app.py`, the Space's entry point, which sets the target's environment defaults (model id, device,
quantization; a variable set in the Space's settings wins) and runs `app.main`.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .targets import SDK_PROVIDED, Target, get_target

REPO_ROOT = Path(__file__).resolve().parent.parent
APP_FILE = "space_app.py"
CODE_DIRS = ("engine", "diffgemma_ui")
SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^;\s]+)\s*(;.*)?$")


@dataclass(frozen=True)
class Pin:
    """One `name==version[; marker]` line of requirements.txt."""

    name: str
    version: str
    marker: str = ""

    @property
    def key(self) -> str:
        """The normalized project name (PEP 503)."""
        return normalize(self.name)

    def line(self) -> str:
        return f"{self.name}=={self.version}{' ' + self.marker if self.marker else ''}"


def normalize(name: str) -> str:
    """PEP 503 normalized project name: lowercase, runs of `-_.` as one `-`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path = REPO_ROOT / "requirements.txt") -> list[Pin]:
    """The `name==version` pins of a requirements file, in order (comments, options and `-r` lines skipped)."""
    pins = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = PIN.match(line)
        if match is None:
            raise ValueError(f"{path.name}: cannot read {raw.strip()!r} (expected name==version[; marker])")
        pins.append(Pin(match.group(1), match.group(2), (match.group(3) or "").strip()))
    return pins


def front_matter_from_readme(path: Path = REPO_ROOT / "README.md") -> dict[str, str]:
    """The `key: value` lines of a README's front matter (flat keys only), as strings."""
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        return {}
    block = text[4:text.index("\n---", 4)]
    fields = {}
    for line in block.splitlines():
        if ":" in line and not line.startswith((" ", "-")):
            key, value = line.split(":", 1)
            fields[key.strip()] = value.strip().strip('"')
    return fields


def space_requirements(target: Target, quantization: str) -> list[str]:
    """requirements.txt lines for `target`: the repo's pins without what the Gradio SDK installs, torch at the
    target's version (from the CPU index on the CPU target), bitsandbytes only where quantization can be used."""
    lines = [f"# Written by `python -m deploy space --target {target.name}`: the playground's pins for this Space.",
             "# gradio, spaces and huggingface_hub are installed by the Space's Gradio SDK (sdk_version), not here."]
    if target.torch_index:
        lines.append(f"--extra-index-url {target.torch_index}")
    left_out = {normalize(n) for n in (*SDK_PROVIDED, *target.packages_left_out)}
    if quantization == "none" and target.name != "gpu":
        left_out.add("bitsandbytes")
    for pin in read_pins():
        if pin.key in left_out:
            continue
        if pin.key == "torch":
            local = "+cpu" if target.torch_index and target.torch_index.endswith("/cpu") else ""
            lines.append(f"torch=={target.torch_version}{local}")
        else:
            lines.append(pin.line())
    return lines


def _yaml_value(value) -> str:
    if isinstance(value, list):
        return "\n" + "\n".join(f"  - {json.dumps(item)}" for item in value)
    return " " + json.dumps(value, ensure_ascii=False)


def front_matter(target: Target, model: str | None, quantization: str) -> dict:
    """The Space's front matter fields for `target` serving `model` (None: the embedded model)."""
    base = front_matter_from_readme()
    pins = {pin.key: pin.version for pin in read_pins()}
    hardware = target.quantized_hardware.get(quantization, target.hardware)
    fields = {
        "title": f"{base.get('title', 'DiffGemma Playground')}{target.title_suffix}",
        "emoji": base.get("emoji", "🌫️"),
        "colorFrom": base.get("colorFrom", "purple"),
        "colorTo": base.get("colorTo", "indigo"),
        "sdk": "gradio",
        "sdk_version": pins["gradio"],
        "python_version": target.python_version,
        "app_file": APP_FILE,
        "license": base.get("license", "apache-2.0"),
        "short_description": base.get("short_description", "Watch DiffusionGemma denoise text"),
        "suggested_hardware": hardware,
    }
    if model is not None:
        fields["models"] = [model]
        fields["preload_from_hub"] = [model]  # weights fetched at build time, into the hub cache the app reads
    if target.startup_timeout:
        fields["startup_duration_timeout"] = target.startup_timeout
    return fields


def render_readme(target: Target, fields: dict, variables: dict[str, str]) -> str:
    """README.md of the Space: front matter, then what the Space runs and what to set in its settings."""
    head = "---\n" + "".join(f"{key}:{_yaml_value(value)}\n" for key, value in fields.items()) + "---\n"
    body = [f"\n# {fields['title']}\n",
            "A Gradio playground that shows DiffusionGemma, a block text-diffusion language model, turning random "
            "tokens into text one denoising step at a time. Source: the DiffGemma Playground repository "
            f"(this folder was written by `python -m deploy space --target {target.name}`).\n",
            "## Settings of this Space\n"]
    body += [f"- {note}" for note in target.notes]
    body.append("- Environment defaults (set in `space_app.py`; a variable of the same name in the Space's settings "
                "wins): " + ", ".join(f"`{k}={v}`" for k, v in variables.items()) + ".")
    return head + "\n".join(body) + "\n"


def render_entry(variables: dict[str, str]) -> str:
    """`space_app.py`: set the target's environment defaults, then run the playground."""
    assignments = "\n".join(f"os.environ.setdefault({json.dumps(k)}, {json.dumps(v)})" for k, v in variables.items())
    return (
        '"""Entry point of this Space (written by `python -m deploy space`): the playground with this target\'s\n'
        'defaults. A variable set in the Space\'s settings overrides the default here."""\n\n'
        "import os\nimport sys\n\n"
        f"{assignments}\n\n"
        "import app  # noqa: E402 - after the defaults, which app.py reads\n\n"
        'if __name__ == "__main__":\n'
        "    sys.exit(app.main([]))\n"
    )


def write_space(target_name: str, out: Path, *, model: str | None = None, quantization: str | None = None) -> Path:
    """Write the Space folder for `target_name` into `out` (created; must not exist or be empty) and return it.

    Args:
        target_name: `cpu`, `gpu` or `zerogpu`.
        out: the folder to write.
        model: the model id to serve (default: the target's; the CPU target serves the embedded model).
        quantization: one of the target's `quantizations` (default: its first, "none").

    Raises:
        ValueError: unknown target, a quantization the target does not offer, a model for the CPU target, or an
            `out` that is a file or a non-empty folder.
    """
    target = get_target(target_name)
    quantization = quantization or target.quantizations[0]
    if quantization not in target.quantizations:
        raise ValueError(f"target {target.name} takes quantization {' or '.join(target.quantizations)}, "
                         f"got {quantization!r}")
    if model is not None and target.model is None:
        raise ValueError(f"target {target.name} serves the embedded model; use --target gpu or zerogpu for {model}")
    model = model or target.model
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder: choose a new one")
    out.mkdir(parents=True, exist_ok=True)

    shutil.copy2(REPO_ROOT / "app.py", out / "app.py")
    for name in CODE_DIRS:
        shutil.copytree(REPO_ROOT / name, out / name, ignore=SKIPPED)
    shutil.copytree(REPO_ROOT / "assets", out / "assets",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*", "models", "configs", "screenshot.png"))
    if target.ship_tiny_model:
        tiny = Path("assets", "models", "diffgemma-tiny")
        shutil.copytree(REPO_ROOT / tiny, out / tiny, ignore=SKIPPED)

    variables = dict(target.variables)
    if model is not None:
        variables["DIFFGEMMA_MODEL"] = model
    if quantization != "none":
        variables["DIFFGEMMA_QUANTIZATION"] = quantization
    fields = front_matter(target, model, quantization)
    (out / "README.md").write_text(render_readme(target, fields, variables), encoding="utf-8")
    (out / "requirements.txt").write_text("\n".join(space_requirements(target, quantization)) + "\n",
                                          encoding="utf-8")
    (out / APP_FILE).write_text(render_entry(variables), encoding="utf-8")
    return out
