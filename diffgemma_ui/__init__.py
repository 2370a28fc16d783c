"""DiffGemma Playground UI: Gradio views of the engine's frames.

- The run mechanism: `runs` (every tab's model work as a frame source in a worker thread: Stop, closed tab,
  abandoned API call, time limit), `record` (a run's frames), `session` (the Playground's per-session tickets),
  `zerogpu` (the same jobs in ZeroGPU's GPU process), `deployment` (where it runs, threads, malloc arenas).
- The tab skeleton: `tab` (errors, the refusal box, settings controls and API signatures from the settings table),
  `validation` (input checks).
- Tabs: `handlers` + `blocks` (Playground and the app), `step_through`, `keep` + `keep_blocks` (traces, replay,
  /export), `presenter` (the full-screen player), `branch_tab` (branch a run from a step), `race_tab`,
  `compare_tab`, `chat_tab`, `infill_tab` (each: layout, handlers, API and views).
- Views: `text` (escaping, in one place), `colors`, `canvas_view`, `token_view`, `thought_view`, `plots`, `meter`
  (the offline replay page is the engine's: `engine.replay_page`).
"""

from .blocks import build_app

__all__ = ["build_app"]
