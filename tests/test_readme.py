"""The README is a newcomer's page: at most 8 KB, its two Quick start commands are the ones that start the app and
run CI, and every file it links to exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_short_and_its_quick_start_runs_the_app_and_ci():
    assert len(README.encode("utf-8")) <= 8_000
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", quick_start, flags=re.S)
    assert len(blocks) == 2 and blocks[0].rstrip().endswith(".venv/bin/python app.py") and blocks[1] == "bash .ci/run\n"
    assert (REPO / ".ci" / "run").is_file() and (REPO / "app.py").is_file()


def test_every_file_the_readme_links_to_exists():
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", README) if "://" not in t]
    assert len(targets) >= 10
    assert [t for t in targets if not (REPO / t).exists()] == []
