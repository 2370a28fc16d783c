"""DiffGemma Playground's entry point (Spaces too): `python app.py --help` lists the options. The model is the
server's choice; web users cannot change it."""

import argparse
import os
import sys

import diffgemma_ui
from diffgemma_ui.deployment import (default_threads, import_spaces, limit_malloc_arenas, load_zero_gpu_model,
                                     port_in_use, zero_gpu)
from engine import DiffusionEngine, ModelLoadError, load_model
from engine.cli import fail
from engine.loading import DEFAULT_MODEL, DEVICES, DTYPES, QUANTIZATIONS, set_serving_threads
from engine.quantization import cpu_path
from engine.race import race_runner
from engine.settings import parse_number
from engine.wording import plural

TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _env(name: str, default: str) -> str:
    return os.environ.get(name, "").strip() or default


def _number(kind, text: str, what: str, check, out_of_range: str | None = None):
    """`text` as `kind` passing `check`, else `ArgumentTypeError` naming `what` (or `out_of_range`)."""
    value = parse_number(text)
    if value is None or kind is int and not isinstance(value, int):
        raise argparse.ArgumentTypeError(f"{what}, got {text!r}")
    if not check(value):
        raise argparse.ArgumentTypeError(f"{out_of_range or what}, got {value if kind is int else repr(text)}")
    return kind(value)


def _port(text: str) -> int:
    return _number(int, text, "port must be an integer", lambda port: 0 < port < 65536, "port must be in 1..65535")


def _threads(text: str) -> int | None:
    auto = text.strip().lower() == "auto"
    return None if auto else _number(int, text, "threads must be 'auto' or an integer >= 1", lambda n: n >= 1)


def _seconds(text: str) -> float | None:
    return _number(float, text, "max run seconds must be a number >= 0", lambda s: s >= 0 and s != float("inf")) or None


def build_parser() -> argparse.ArgumentParser:
    """The command line; defaults read from the environment at call time."""
    parser = argparse.ArgumentParser(
        prog="app.py", description="DiffGemma Playground: watch block diffusion denoise text, live in the browser.",
        epilog="Each option's default comes from the environment variable its help names.")

    def option(flag: str, env: str, default: str, help: str, *, shown: str | None = None, **kwargs) -> None:
        parser.add_argument(flag, default=_env(env, default), **kwargs,
                            help=f"{help} (default: {shown or default}; env {env})")

    option("--model", "DIFFGEMMA_MODEL", str(DEFAULT_MODEL), "local model folder or hub id", shown="embedded model")
    option("--device", "DIFFGEMMA_DEVICE", "auto", "where to run", choices=DEVICES)
    option("--dtype", "DIFFGEMMA_DTYPE", "auto", "weight dtype", shown="auto: bf16 on CUDA, else fp32", choices=DTYPES)
    option("--quantization", "DIFFGEMMA_QUANTIZATION", "none", "quantize every weight: 4bit (NF4) or 8bit with "
           "bitsandbytes on CUDA or CPU; fp8 (FineGrainedFP8) on CUDA compute capability 8.9+", choices=QUANTIZATIONS)
    option("--ar-model", "DIFFGEMMA_AR_MODEL", "", "separate causal LM for the Race tab's autoregressive side, "
           "refused when it does not fit", shown="the diffusion model's own causal encoder")
    option("--threads", "DIFFGEMMA_THREADS", "auto", "torch CPU threads", type=_threads,
           shown="auto = CPUs - 1 on CPU, leaving one for the web server")
    option("--max-run-seconds", "DIFFGEMMA_MAX_RUN_SECONDS", "300", "stop any run (page or API) after this many "
           "seconds with a clear message; 0: no limit", type=_seconds)
    option("--host", "DIFFGEMMA_HOST", _env("GRADIO_SERVER_NAME", "127.0.0.1"), "address to listen on",
           shown="127.0.0.1, or GRADIO_SERVER_NAME")
    option("--port", "DIFFGEMMA_PORT", _env("GRADIO_SERVER_PORT", "7860"), "port", type=_port,
           shown="7860, or GRADIO_SERVER_PORT")
    parser.add_argument("--share", action=argparse.BooleanOptionalAction,
                        default=_env("DIFFGEMMA_SHARE", "false").lower() in TRUE_WORDS,
                        help="create a public gradio.live link (default: off; env DIFFGEMMA_SHARE=1)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse options, load and warm up the model, serve the app; returns the exit status (2: bad model or options)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    share_word = _env("DIFFGEMMA_SHARE", "false").lower()
    if share_word not in TRUE_WORDS + FALSE_WORDS:
        parser.error(f"DIFFGEMMA_SHARE must be one of {', '.join(TRUE_WORDS + FALSE_WORDS)}, got {share_word!r}")
    if busy := port_in_use(args.host, args.port):  # before the model loads
        return fail(f"cannot listen on {args.host}:{args.port} ({busy}): pick another port with --port or "
                    "DIFFGEMMA_PORT")
    limit_malloc_arenas()
    on_zero_gpu = zero_gpu()
    if on_zero_gpu:
        import_spaces()  # it patches torch before anything touches CUDA
    print(f"Loading {args.model} (device {args.device}, dtype {args.dtype}, quantization {args.quantization})...",
          flush=True)
    try:
        load = load_zero_gpu_model if on_zero_gpu else load_model
        engine = DiffusionEngine(load(args.model, args.device, args.dtype, args.quantization))
    except ModelLoadError as error:
        return fail(error)
    except Exception as error:  # noqa: BLE001 - one clear line, never a traceback
        return fail(f"could not load the model: {type(error).__name__}: {error}")
    if path := cpu_path(args.quantization, engine.device):
        print(path, flush=True)
    threads = set_serving_threads(engine.device, args.threads or default_threads())
    if not on_zero_gpu:  # each ZeroGPU process warms up itself
        try:
            print(f"Warming up: {engine.warm_up():.1f} s", flush=True)
        except Exception as error:  # noqa: BLE001 - one clear line
            return fail(f"the model loaded but failed a first generation: {type(error).__name__}: {error}")
    try:
        race = race_runner(engine, args.ar_model) if args.ar_model else None
    except ModelLoadError as error:
        return fail(error)
    app = diffgemma_ui.build_app(engine, max_run_s=args.max_run_seconds, race=race)
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    print(f"DiffGemma Playground on {engine.device} ({plural(threads, 'CPU thread')}): local URL "
          f"http://{shown_host}:{args.port}", flush=True)
    if not args.share:
        print("For a public gradio.live link, start it with --share (or DIFFGEMMA_SHARE=1).", flush=True)
    try:  # quiet unless sharing: Gradio's startup lines name launch() arguments, not --share
        app.launch(server_name=args.host, server_port=args.port, share=args.share, show_error=False,
                   quiet=not args.share)
    except OSError as error:
        return fail(f"cannot listen on {args.host}:{args.port}: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
