"""English for a count in a message or a view: the one plural rule of the engine, the CLI and the app."""


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """`count` (thousands separated) and `noun`, made plural (`plural_noun`, else `noun` + "s") unless `count` is 1:
    "1 position", "1,024 positions", "2 canvases"."""
    return f"{count:,} {noun if count == 1 else plural_noun or noun + 's'}"
