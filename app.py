"""DiffGemma Playground: the Gradio app (Hugging Face Spaces entry point).

    python app.py [--model PATH_OR_HUB_ID] [--device auto|cpu|cuda|mps] [--dtype auto|float32|bfloat16|float16]
                  [--quantization none|4bit|8bit|fp8] [--ar-model ID] [--threads N] [--max-run-seconds S]
                  [--host HOST] [--port PORT] [--share]

Every option has an environment variable default (DIFFGEMMA_MODEL, DIFFGEMMA_DEVICE, DIFFGEMMA_DTYPE,
DIFFGEMMA_QUANTIZATION, DIFFGEMMA_AR_MODEL, DIFFGEMMA_THREADS, DIFFGEMMA_MAX_RUN_SECONDS, DIFFGEMMA_HOST,
DIFFGEMMA_PORT, DIFFGEMMA_SHARE); the host and port also honour GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, which
Hugging Face Spaces sets. The model is chosen here, by whoever runs the server; web users cannot change it.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import diffgemma_ui
from diffgemma_ui.deployment import default_threads, zero_gpu
from diffgemma_ui.malloc_arenas import limit_malloc_arenas
from diffgemma_ui.zerogpu import load_zero_gpu_model
from engine import DiffusionEngine, ModelLoadError, load_model
from engine.loading import DEFAULT_MODEL, DEVICES, DTYPES, QUANTIZATIONS, set_serving_threads
from engine.race import race_runner

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _env(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def _one_line(error: BaseException) -> str:
    """The error's message on one line (library messages, e.g. transformers' or the hub's, span several)."""
    return " ".join(str(error).split())


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be an integer, got {text!r}") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, got {port}")
    return port


def _threads(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return None
    try:
        threads = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"threads must be 'auto' or an integer >= 1, got {text!r}") from None
    if threads < 1:
        raise argparse.ArgumentTypeError(f"threads must be 'auto' or an integer >= 1, got {threads}")
    return threads


def _seconds(text: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"max run seconds must be a number >= 0, got {text!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"max run seconds must be a number >= 0, got {text!r}")
    return seconds or None


def port_in_use(host: str, port: int) -> str | None:
    """Why the server could not listen on `host`:`port` (an OSError's message), or None when it can. Binds a socket
    with SO_REUSEADDR, as the server (uvicorn) does, so a port left in TIME_WAIT by a stopped server counts as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.strerror or str(error)
    return None


def build_parser() -> argparse.ArgumentParser:
    """The command line; defaults read from the environment at call time."""
    default_host = _env("DIFFGEMMA_HOST", _env("GRADIO_SERVER_NAME", "127.0.0.1"))
    default_port = _env("DIFFGEMMA_PORT", _env("GRADIO_SERVER_PORT", "7860"))
    parser = argparse.ArgumentParser(
        prog="app.py",
        description="DiffGemma Playground: watch block diffusion denoise text, live in the browser.",
        epilog="Environment variables give the defaults: DIFFGEMMA_MODEL, DIFFGEMMA_DEVICE, DIFFGEMMA_DTYPE, "
        "DIFFGEMMA_QUANTIZATION, DIFFGEMMA_AR_MODEL, DIFFGEMMA_THREADS, DIFFGEMMA_MAX_RUN_SECONDS, "
        "DIFFGEMMA_HOST (else "
        "GRADIO_SERVER_NAME), DIFFGEMMA_PORT (else GRADIO_SERVER_PORT), DIFFGEMMA_SHARE.",
    )
    parser.add_argument("--model", default=_env("DIFFGEMMA_MODEL", str(DEFAULT_MODEL)),
                        help="local model folder or hub id (default: the embedded diffgemma-tiny; env DIFFGEMMA_MODEL)")
    parser.add_argument("--device", default=_env("DIFFGEMMA_DEVICE", "auto"), choices=DEVICES,
                        help="where to run (default: auto; env DIFFGEMMA_DEVICE)")
    parser.add_argument("--dtype", default=_env("DIFFGEMMA_DTYPE", "auto"), choices=DTYPES,
                        help="weight dtype (default: auto = bf16 on CUDA, fp32 elsewhere; env DIFFGEMMA_DTYPE)")
    parser.add_argument("--quantization", default=_env("DIFFGEMMA_QUANTIZATION", "none"), choices=QUANTIZATIONS,
                        help="quantize the weights, experts included: 4bit (NF4) or 8bit, bitsandbytes, on CUDA or "
                             "CPU; "
                             "fp8 (transformers FineGrainedFP8), CUDA compute capability 8.9+ only "
                             "(default: none; env DIFFGEMMA_QUANTIZATION)")
    parser.add_argument("--ar-model", default=_env("DIFFGEMMA_AR_MODEL", "") or None,
                        help="separate causal LM for the Race tab's autoregressive side (default: the diffusion "
                             "model's own causal encoder; env DIFFGEMMA_AR_MODEL); refused when it does not fit")
    parser.add_argument("--threads", type=_threads, default=_env("DIFFGEMMA_THREADS", "auto"),
                        help="torch CPU threads (default: auto = CPUs - 1 on CPU, leaving one for the web server; "
                             "env DIFFGEMMA_THREADS)")
    parser.add_argument("--max-run-seconds", type=_seconds, default=_env("DIFFGEMMA_MAX_RUN_SECONDS", "300"),
                        help="stop any run (page or API) after this many seconds with a clear message; 0: no limit "
                             "(default: 300; env DIFFGEMMA_MAX_RUN_SECONDS)")
    parser.add_argument("--host", default=default_host,
                        help="address to listen on (default: 127.0.0.1, or GRADIO_SERVER_NAME; env DIFFGEMMA_HOST)")
    parser.add_argument("--port", type=_port, default=default_port,
                        help="port (default: 7860, or GRADIO_SERVER_PORT; env DIFFGEMMA_PORT)")
    parser.add_argument("--share", action=argparse.BooleanOptionalAction,
                        default=_env("DIFFGEMMA_SHARE", "false").lower() in TRUE_WORDS,
                        help="create a public gradio.live link (default: off; env DIFFGEMMA_SHARE=1)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse options, load the model, warm it up, serve the app. Returns the exit status (2: bad model or options)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    share_word = _env("DIFFGEMMA_SHARE", "false").lower()
    if share_word not in TRUE_WORDS + FALSE_WORDS:
        parser.error(f"DIFFGEMMA_SHARE must be one of {', '.join(TRUE_WORDS + FALSE_WORDS)}, got {share_word!r}")
    busy = port_in_use(args.host, args.port)  # before minutes of model loading, not after
    if busy:
        print(f"error: cannot listen on {args.host}:{args.port} ({busy}): pick another port with --port or "
              "DIFFGEMMA_PORT", file=sys.stderr)
        return 2
    limit_malloc_arenas()  # before the model and the server's threads allocate (MALLOC_ARENA_MAX, if set, wins)

    on_zero_gpu = zero_gpu()  # what the platform says (SPACES_ZERO_GPU), not whether `spaces` imports
    if on_zero_gpu:
        import spaces  # noqa: F401, PLC0415 - before anything touches CUDA: it patches torch for ZeroGPU

    print(f"Loading {args.model} (device {args.device}, dtype {args.dtype}, quantization {args.quantization})...",
          flush=True)
    try:
        if on_zero_gpu:
            if args.device not in ("auto", "cuda"):
                raise ModelLoadError(f"on ZeroGPU the model runs on the GPU: device must be auto or cuda, got "
                                     f"{args.device!r}")
            engine = DiffusionEngine(load_zero_gpu_model(args.model, args.dtype, args.quantization))
        else:
            engine = DiffusionEngine(load_model(args.model, args.device, args.dtype, args.quantization))
    except ModelLoadError as error:
        print(f"error: {_one_line(error)}", file=sys.stderr)
        return 2
    except Exception as error:  # noqa: BLE001 - one clear line, never a traceback
        print(f"error: could not load the model: {type(error).__name__}: {_one_line(error)}", file=sys.stderr)
        return 2

    threads = set_serving_threads(engine.device, args.threads if args.threads is not None else default_threads())
    # On ZeroGPU the GPU exists only inside a request: each GPU process warms up before its first run instead
    if not on_zero_gpu:
        try:
            print(f"Warming up: {engine.warm_up():.1f} s", flush=True)
        except Exception as error:  # noqa: BLE001 - a model that loads but cannot generate: one clear line
            print(f"error: the model loaded but failed a first generation: {type(error).__name__}: "
                  f"{_one_line(error)}", file=sys.stderr)
            return 2
    race = None
    if args.ar_model:
        try:
            race = race_runner(engine, args.ar_model)
        except ModelLoadError as error:
            print(f"error: {_one_line(error)}", file=sys.stderr)
            return 2
    app = diffgemma_ui.build_app(engine, max_run_s=args.max_run_seconds, race=race)
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    threads_text = f"{threads} CPU thread{'s' * (threads != 1)}"
    print(f"DiffGemma Playground on {engine.device} ({threads_text}): local URL http://{shown_host}:{args.port}",
          flush=True)
    if not args.share:
        print("For a public gradio.live link, start it with --share (or DIFFGEMMA_SHARE=1).", flush=True)
    # quiet unless sharing: Gradio's own startup lines would tell the visitor to "set share=True in launch()",
    # which this app takes as --share; with --share they print the public link
    try:
        app.launch(server_name=args.host, server_port=args.port, share=args.share, show_error=False,
                   quiet=not args.share)
    except OSError as error:  # the port was taken while the model loaded
        print(f"error: cannot listen on {args.host}:{args.port}: {_one_line(error)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
