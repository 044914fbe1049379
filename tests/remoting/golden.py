"""The golden frames RocketMQ's own RemotingCommand wrote: ``data/golden_frames.txt``.

One ``name hex`` a line, as the Java program in ``test_java_frames.py`` prints them
(``fastEncodeHeader`` and the body, the bytes NettyEncoder sends).
"""

from __future__ import annotations

from pathlib import Path

GOLDEN_FILE = Path(__file__).parent / "data" / "golden_frames.txt"


def load() -> dict[str, bytes]:
    """Return the golden frames by name."""
    lines = GOLDEN_FILE.read_text().split("\n")
    return {name: bytes.fromhex(hx) for name, hx in (line.split() for line in lines if line)}


GOLDEN = load()
