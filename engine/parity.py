"""Parity check: the engine's tokens equal `model.generate()`'s (`python -m engine.parity [--model] [--cases]`)."""

import argparse
import sys
from dataclasses import dataclass

import torch

from .engine import DiffusionEngine
from .generator import strip_after_eos
from .loading import DEFAULT_MODEL, load_model


@dataclass(frozen=True)
class ParityCase:
    """One comparison; `changes`: (setting, value) pairs over the recommended."""

    seed: int
    prompt: str
    raw: bool = False
    changes: tuple = ()
    thinking: bool = False

    def label(self) -> str:
        changed = ", ".join(f"{k}={v}" for k, v in self.changes) or "recommended"
        return f"seed={self.seed} raw={self.raw}{' thinking' if self.thinking else ''} {changed}"


def case(seed: int, prompt: str, *, raw: bool = False, thinking: bool = False, **changes) -> ParityCase:
    return ParityCase(seed, prompt, raw, tuple(changes.items()), thinking)


PARITY_CASES: list[ParityCase] = [
    case(0, "In the beginning", raw=True),
    case(1, "The Lord is my shepherd"),
    case(2, "Blessed are the", raw=True, max_new_tokens=256),
    case(3, "And God said", raw=True, adaptive_stopping=False, max_denoising_steps=6),
    case(4, "Love is patient", adaptive_stopping=False, max_new_tokens=200),
    case(5, "x", raw=True, max_new_tokens=1),
    case(6, "Then Jesus said", max_new_tokens=512, max_denoising_steps=4),
    case(7, "In the beginning", raw=True, max_denoising_steps=1),
    case(8, "Praise the Lord", entropy_bound=1e-6, max_denoising_steps=5),
    case(9, "Praise the Lord", entropy_bound=1000.0),
    case(10, "The heavens declare", t_min=0.0, t_max=0.01),
    case(11, "The heavens declare", t_min=5.0, t_max=10.0, max_denoising_steps=4),
    case(12, "Let there be light", raw=True, stability_threshold=0),
    case(13, "Let there be light", raw=True, stability_threshold=64, max_denoising_steps=8),
    case(14, "Who is my neighbor?", confidence_threshold=100.0),
    case(15, "Who is my neighbor?", confidence_threshold=1e-9, max_denoising_steps=6),
    case(16, "🙂 שלום <script>", max_new_tokens=128),
    case(17, "Now the serpent", raw=True, entropy_bound=2.0, max_new_tokens=384, max_denoising_steps=8),
    case(18, "He said to them", max_denoising_steps=96, max_new_tokens=64),
    case(19, "Give thanks", raw=True, t_min=0.1, t_max=1.5),
    case(123456789, "A wise son", max_new_tokens=128),
    case(2**63 - 1, "Hear, O Israel", raw=True, max_new_tokens=64),
]
# For the 26B stand-in (`standin/`): few forwards each
STANDIN_PARITY_CASES: list[ParityCase] = [
    case(0, "In the beginning", raw=True, max_denoising_steps=2),
    case(1, "Why is the sky blue?", max_denoising_steps=2),
    case(2, "Why is the sky blue?", thinking=True, max_denoising_steps=1),
    case(3, "x", raw=True, max_denoising_steps=1, max_new_tokens=300, adaptive_stopping=False),
]
CASE_SETS = {"embedded": PARITY_CASES, "standin": STANDIN_PARITY_CASES}


def run_case(engine: DiffusionEngine, case: ParityCase) -> tuple[list[int], list[int], str]:
    """(generate() ids, engine ids, engine stop reason), ids up to and including the first EOS."""
    settings = engine.recommended.replace(**dict(case.changes))
    input_ids = engine.encode_prompt(case.prompt, raw=case.raw, thinking=case.thinking)
    torch.manual_seed(case.seed)
    sequences = engine.model.generate(input_ids, **settings.generate_kwargs()).sequences
    expected = strip_after_eos(sequences[0, input_ids.shape[1] :].tolist(), engine.model.generation_config.eos_token_id)
    result = engine.generate(case.prompt, settings, raw=case.raw, seed=case.seed, thinking=case.thinking)
    return expected, result.token_ids, result.stop_reason


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--cases", choices=sorted(CASE_SETS), default="embedded",
                        help="embedded: many settings (small model); standin: few forwards (the stand-in)")
    args = parser.parse_args()
    engine = DiffusionEngine(load_model(args.model))
    cases = CASE_SETS[args.cases]
    failures = 0
    for case in cases:
        expected, got, stop_reason = run_case(engine, case)
        same = expected == got
        failures += not same
        print(f"{'ok  ' if same else 'FAIL'} {len(got):4d} tokens  stop={stop_reason:<14} {case.label()}")
    print(f"{len(cases) - failures}/{len(cases)} cases identical to model.generate()")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
