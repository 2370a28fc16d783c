"""The GPU kit's steps, one per process (`benchmarks/gpu/run.sh` runs them; README.md beside it).

    python benchmarks/gpu/steps.py --step NAME --out DIR [--rehearsal]

Each step writes `DIR/<its file>.json` again after every figure, so a crash, a sticky CUDA error or a time cap
loses only what was not measured yet; every file holds the versions actually imported. `--rehearsal` runs the same
steps on the CPU with tiny models (every figure then says so). This module needs only torch; the model steps live
in `measure.py`, imported when one runs, so that `env` still reports when transformers or bitsandbytes do not import.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.gpu.record import FILES

EXPECTED = {"transformers": "5.23.0", "bitsandbytes": "0.50.2"}  # what prepare.sh packs into .gpu/


class Result:
    """One step's JSON file, written again (atomically) whenever a figure is added."""

    def __init__(self, out: Path, step: str, rehearsal: bool):
        self.path = out / f"{FILES[step]}.json"
        self.data = {"step": step, "rehearsal": rehearsal,
                     "measured_on": "CPU rehearsal with tiny models: not GPU figures" if rehearsal else "GPU",
                     "status": "running", "started_unix": round(time.time(), 1), "versions": versions(),
                     "figures": {}, "errors": []}
        self.write()

    def add(self, key: str, value) -> None:
        self.data["figures"][key] = value
        self.write()

    def error(self, where: str, error: BaseException) -> None:
        self.data["errors"].append({"where": where, "error": f"{type(error).__name__}: {error}"[:1000]})
        self.write()

    def done(self) -> None:
        self.data["status"] = "done" if not self.data["errors"] else "done with errors"
        self.data["seconds"] = round(time.time() - self.data["started_unix"], 1)
        self.write()

    def write(self) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.data, indent=1, default=str))
        temporary.replace(self.path)


def loaded_native_libraries(fragment: str = "libbitsandbytes") -> list[str]:
    """Paths of the shared libraries this process has mapped whose name contains `fragment` (Linux only)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps.splitlines() if fragment in line})


def nvidia_smi() -> dict | None:
    """Driver version, GPU name, total and free memory as nvidia-smi reports them; None without nvidia-smi."""
    query = "driver_version,name,memory.total,memory.free"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return dict(zip(query.split(","), (v.strip() for v in out.splitlines()[0].split(",")))) if out else None


def versions() -> dict:
    """What this process actually imports: Python, torch and its CUDA, transformers and bitsandbytes (version,
    file, which native library got loaded), the packages transformers checks at import, the GPU. A package that
    fails to import says why."""
    info = {"python": platform.python_version(), "executable": sys.executable,
            "pythonpath": os.environ.get("PYTHONPATH", "")}
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    for name in ("transformers", "bitsandbytes", "accelerate", "tokenizers", "huggingface_hub", "safetensors",
                 "regex"):
        try:
            module = __import__(name)
            info[name] = {"version": module.__version__, "file": module.__file__}
        except Exception as error:  # noqa: BLE001 - a broken install is a finding, not a crash
            info[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
    info["bitsandbytes_native_libraries"] = loaded_native_libraries()
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        info.update(gpu=torch.cuda.get_device_name(), capability=".".join(map(str, torch.cuda.get_device_capability())),
                    gpu_free_bytes=free, gpu_total_bytes=total, nvidia_smi=nvidia_smi())
    return info


def install_problems(info: dict) -> list[str]:
    """What differs from the kit's install in the versions `info` (`versions()`): a package of another version or
    from outside PYTHONPATH's first folder, or (on CUDA) no bitsandbytes CUDA library loaded."""
    site = info["pythonpath"].split(":")[0]
    problems = []
    for name, wanted in EXPECTED.items():
        found = info[name]
        if found.get("version") != wanted:
            problems.append(f"{name} {found.get('version', found.get('error'))} imported, not {wanted}")
        elif site and not found["file"].startswith(site):
            problems.append(f"{name} imported from {found['file']}, not from {site}")
    if info["cuda_available"] and not any("cuda" in lib for lib in info["bitsandbytes_native_libraries"]):
        problems.append(f"no bitsandbytes CUDA library loaded: {info['bitsandbytes_native_libraries']}")
    return problems


def measuring():
    """The model steps (`measure.py`), imported when a step needs them: they import transformers and the engine."""
    from benchmarks.gpu import measure  # noqa: PLC0415 - transformers or bitsandbytes may not import here

    return measure


def step_env(result: Result, rehearsal: bool) -> None:
    """Versions (already in every file) checked against the kit's install, CPU count, measured memory bandwidth."""
    problems = install_problems(result.data["versions"])
    result.add("install_verified", not problems)
    for problem in problems:
        result.error("install", RuntimeError(problem))
    result.add("cpus", os.cpu_count())
    try:
        measure = measuring()
    except Exception as error:  # noqa: BLE001 - the finding this step exists for
        result.error("import engine", error)
        return
    result.add("engine_imports", True)
    result.add("measured_bandwidth_bytes_per_s", measure.measure_bandwidth(measure.device_of(rehearsal)))


def run_step(step: str, out: Path, rehearsal: bool) -> int:
    """Run one step, its file under `out`; returns 0, or 1 when the step failed (the file says where)."""
    result = Result(out, step, rehearsal)
    try:
        if step == "env":
            step_env(result, rehearsal)
        else:
            measuring().STEPS[step](result, rehearsal)
    except BaseException as error:  # noqa: BLE001 - the file keeps what was measured and says what broke
        result.error("step", error)
        result.done()
        raise
    result.done()
    return 1 if result.data["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", choices=list(FILES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rehearsal", action="store_true", help="the CPU with tiny models")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    return run_step(args.step, args.out, args.rehearsal)


if __name__ == "__main__":
    sys.exit(main())
