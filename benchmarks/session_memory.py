"""Memory kept per browser session (issue 13 item 11): RSS of this process while sessions run one UI run each.

    python benchmarks/session_memory.py [--sessions 60] [--keep]

Drives `Playground.generate_stream` directly (no web server, no browser) on the embedded model, one session after
another (256 new tokens, 8 steps, adaptive stopping off: 32 forwards a run). After each run the session's tab
"closes" (`Playground.unload`, what Gradio's unload event calls), unless `--keep`; the session objects themselves
stay referenced, as Gradio keeps a closed session's gr.State for an hour. Prints RSS every 20 sessions. What it does
not measure: Gradio's own per-session memory in a served app (`benchmarks/load_test.py --browser-sessions 50`
measures that, with real browser tabs).
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _Request:
    def __init__(self, session_hash: str):
        self.session_hash = session_hash


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--keep", action="store_true", help="never close the tabs (no unload): the old behaviour")
    args = parser.parse_args()
    import psutil

    from diffgemma_ui.handlers import Playground
    from diffgemma_ui.session import SessionState
    from engine import DiffusionEngine, load_model

    playground = Playground(DiffusionEngine(load_model(device="cpu")), max_fps=1000, reader_budget=None)
    run = ("In the beginning", True, 256, 8, 0.5, 0.4, 0.8, 1, 0.05, False, 0)
    process = psutil.Process()

    def rss_mb() -> float:
        gc.collect()
        return process.memory_info().rss / 1e6

    list(playground.generate_stream(SessionState(), *run, request=_Request("warm-up")))
    playground.unload(_Request("warm-up"))
    base, kept = rss_mb(), []
    for i in range(args.sessions):
        session = SessionState()
        kept.append(session)
        list(playground.generate_stream(session, *run, request=_Request(f"s{i}")))
        if not args.keep:
            playground.unload(_Request(f"s{i}"))
        if (i + 1) % 20 == 0 or i + 1 == args.sessions:
            now = rss_mb()
            print(f"{i + 1} sessions ({'kept' if args.keep else 'tabs closed'}): RSS {now:.0f} MB, "
                  f"+{now - base:.1f} MB over {base:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
