"""The three Hugging Face Spaces this project deploys to (`cpu`, `gpu`, `zerogpu`) and what each one's files say.

Why each value is what it is (front matter keys, Python and torch versions, hardware): docs/deploy.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REAL_MODEL = "google/diffusiongemma-26B-A4B-it"
# Never in a Space's requirements: the Gradio SDK installs gradio (sdk_version), spaces and huggingface_hub itself
SDK_PROVIDED = ("gradio", "spaces", "huggingface_hub", "huggingface-hub")
ZEROGPU_TORCH = ">=2.8,<2.12"  # ZeroGPU's documented torch versions: 2.8 to 2.11
ANY_TORCH = ">=2.6"  # a dedicated machine runs any torch that transformers 5.23 accepts (torch>=2.6)
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True)
class Target:
    """One deployment target.

    Attributes:
        name: `cpu`, `gpu` or `zerogpu` (the command's `--target`).
        title_suffix: added to the Space's title.
        hardware: the `suggested_hardware` value; `quantized_hardware` the value for a `--quantization` choice
            whose weights fit a smaller card.
        python_version: the Space's Python (must satisfy every pinned package's Requires-Python).
        torch_version: the torch pinned in the Space's requirements; `torch_supported` (a PEP 440 specifier) the
            versions the target supports.
        torch_index: an extra package index for torch (the CPU wheels), or None for PyPI.
        model: the model id the Space serves (None: the embedded diffgemma-tiny shipped in the folder).
        variables: environment defaults the Space's entry point sets (a Space's own variables override them).
        quantizations: the `--quantization` values this target accepts (the first is the default).
        packages_left_out: pinned packages of requirements.txt this target does not install.
        startup_timeout: `startup_duration_timeout`, or None for the platform's 30 min.
        ship_tiny_model: copy `assets/models/diffgemma-tiny` into the folder.
        notes: lines for the folder's README (what to set in the Space's settings).
    """

    name: str
    title_suffix: str
    hardware: str
    python_version: str
    torch_version: str
    torch_supported: str
    torch_index: str | None
    model: str | None
    variables: dict[str, str] = field(default_factory=dict)
    quantizations: tuple[str, ...] = ("none",)
    quantized_hardware: dict[str, str] = field(default_factory=dict)
    packages_left_out: tuple[str, ...] = ("bitsandbytes",)
    startup_timeout: str | None = None
    ship_tiny_model: bool = False
    notes: tuple[str, ...] = ()


TARGETS = {
    "cpu": Target(
        name="cpu", title_suffix="", hardware="cpu-basic", python_version="3.11",
        torch_version="2.13.0", torch_supported=ANY_TORCH, torch_index=CPU_TORCH_INDEX, model=None,
        variables={"DIFFGEMMA_DEVICE": "cpu"}, ship_tiny_model=True,
        notes=("Hardware: CPU basic (the default). The embedded 7M-parameter diffgemma-tiny model ships in this "
               "folder; torch threads follow the Space's CPU_CORES.",),
    ),
    "gpu": Target(
        name="gpu", title_suffix=" (26B, GPU)", hardware="a100-large", python_version="3.11",
        torch_version="2.13.0", torch_supported=ANY_TORCH, torch_index=None, model=REAL_MODEL,
        variables={"DIFFGEMMA_MODEL": REAL_MODEL, "DIFFGEMMA_DEVICE": "cuda"},
        quantizations=("none", "4bit", "8bit"), quantized_hardware={"4bit": "l4x1", "8bit": "l40sx1"},
        packages_left_out=(), startup_timeout="1h",
        notes=("Hardware: Nvidia A100 large (80 GB) for bf16; with --quantization 8bit (27 GB of weights) an L40S "
               "(48 GB, `l40sx1`); with 4bit (16 GB) an L4 (24 GB, `l4x1`) or A10G large.",
               "If the model repository is gated, add a secret HF_TOKEN (a read token of an account that was granted "
               "access) in the Space's settings.",),
    ),
    "zerogpu": Target(
        name="zerogpu", title_suffix=" (26B, ZeroGPU)", hardware="zero-a10g", python_version="3.12",
        torch_version="2.11.0", torch_supported=ZEROGPU_TORCH, torch_index=None, model=REAL_MODEL,
        variables={"DIFFGEMMA_MODEL": REAL_MODEL},
        startup_timeout="1h",
        notes=("Hardware: ZeroGPU (a PRO or organization account). The model runs in bf16 on an `xlarge` ZeroGPU "
               "slice (52 GB of weights); each run asks for GPU time computed from its tokens and steps "
               "(DIFFGEMMA_ZEROGPU_SECONDS_PER_FORWARD and DIFFGEMMA_ZEROGPU_SETUP_SECONDS: set them from the "
               "Space's logs) and a request that cannot fit a visitor's daily quota is refused before it starts.",
               "If the model repository is gated, add a secret HF_TOKEN (a read token of an account that was granted "
               "access) in the Space's settings.",),
    ),
}


def get_target(name: str) -> Target:
    """The `Target` called `name`. Raises ValueError listing the targets for an unknown name."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}") from None
