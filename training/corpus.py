"""Build the diffgemma-tiny training corpus from the World English Bible shipped by Debian's `sword-text-web`.

The World English Bible is in the public domain. Debian ships it as a SWORD "zText" module: verse texts with OSIS
markup, zlib-compressed in blocks (`*.bzz`), with a block index (`*.bzs`: offset, size, uncompressed size as three
little-endian uint32) and a verse index (`*.bzv`: block, offset as uint32 and size as uint16). This module decodes
those files directly, strips the markup and footnotes, and writes one JSON line per chapter:
`{"book": ..., "chapter": ..., "verses": [...]}`. Chapters are split into train and validation sets by a seeded
hash of their name, so the split is stable when the corpus is rebuilt.

Run: `python -m training.corpus --out data/corpus` (needs `apt-get install sword-text-web`).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import re
import struct
import zlib
from pathlib import Path

SWORD_MODULE_DIR = Path("/usr/share/sword/modules/texts/ztext/engWEB2015eb")
VALIDATION_FRACTION = 0.03

_NOTE = re.compile(r"<note\b.*?</note>", re.S)
_TITLE = re.compile(r"<title\b.*?</title>", re.S)
_TAG = re.compile(r"<[^>]+>")
_CHAPTER = re.compile(r'<chapter\b[^>]*\bsID="([^".]+)\.(\d+)"')
_SPACE = re.compile(r"\s+")


def _read_testament(module_dir: Path, testament: str) -> list[str]:
    """Return the raw OSIS text of every verse entry of one testament ("ot" or "nt"), in canonical order."""
    block_index = (module_dir / f"{testament}.bzs").read_bytes()
    compressed = (module_dir / f"{testament}.bzz").read_bytes()
    verse_index = (module_dir / f"{testament}.bzv").read_bytes()
    blocks: dict[int, bytes] = {}
    entries = []
    for k in range(len(verse_index) // 10):
        block, offset, size = struct.unpack("<IIH", verse_index[k * 10 : k * 10 + 10])
        if size == 0:
            continue
        if block not in blocks:
            start, length, _ = struct.unpack("<III", block_index[block * 12 : block * 12 + 12])
            blocks[block] = zlib.decompress(compressed[start : start + length])
        entries.append(blocks[block][offset : offset + size].decode("utf-8", errors="replace"))
    return entries


def clean_osis(text: str) -> str:
    """Strip OSIS markup, footnotes and section titles from one verse entry; return plain text on one line."""
    text = _TITLE.sub(" ", _NOTE.sub(" ", text))
    text = html.unescape(_TAG.sub("", text))
    text = text.replace("\u00a0", " ").replace("\u2019", "'").replace("\u2018", "'")
    text = text.replace("\u201c", '"').replace("\u201d", '"').replace("\u2014", " - ")
    return _SPACE.sub(" ", text).strip()


def read_chapters(module_dir: Path = SWORD_MODULE_DIR) -> list[dict]:
    """Return every chapter of the World English Bible as `{"book", "chapter", "verses"}` dicts, in order.

    Raises:
        FileNotFoundError: the SWORD module is not installed (`apt-get install sword-text-web`).
    """
    if not module_dir.is_dir():
        raise FileNotFoundError(f"{module_dir} not found: install it with `apt-get install sword-text-web`")
    chapters: list[dict] = []
    current: dict | None = None
    for testament in ("ot", "nt"):
        for entry in _read_testament(module_dir, testament):
            marker = _CHAPTER.search(entry)
            if marker:
                current = {"book": marker.group(1), "chapter": int(marker.group(2)), "verses": []}
                chapters.append(current)
                continue
            verse = clean_osis(entry)
            if current is not None and verse:
                current["verses"].append(verse)
    return [c for c in chapters if c["verses"]]


def is_validation(chapter: dict) -> bool:
    """Deterministic split: about `VALIDATION_FRACTION` of chapters, chosen by a hash of "book.chapter"."""
    digest = hashlib.sha256(f"{chapter['book']}.{chapter['chapter']}".encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < VALIDATION_FRACTION


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/corpus"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    chapters = read_chapters()
    splits = {"train": [c for c in chapters if not is_validation(c)], "val": [c for c in chapters if is_validation(c)]}
    for name, rows in splits.items():
        with open(args.out / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        words = sum(len(v.split()) for row in rows for v in row["verses"])
        print(f"{name}: {len(rows)} chapters, {words:,} words -> {args.out / (name + '.jsonl')}")


if __name__ == "__main__":
    main()
