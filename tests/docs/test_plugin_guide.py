"""The plugin guide's client skeleton is the STOMP driver's own code, not a copy that drifts."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "how-to" / "write-a-plugin.md"
CLIENT = ROOT / "plugins" / "activemq" / "client.py"
SECTION = "### A client for a new protocol"


def skeleton_blocks() -> list[str]:
    text = GUIDE.read_text()
    section = text[text.index(SECTION) :]
    return re.findall(r"```python\n(.*?)\n```", section, flags=re.S)


def test_every_block_of_the_skeleton_is_verbatim_in_the_stomp_client() -> None:
    blocks = skeleton_blocks()
    source = CLIENT.read_text()
    assert len(blocks) == 5
    missing = [b.splitlines()[0] for b in blocks if b not in source]
    assert not missing, f"the guide's skeleton drifted from {CLIENT.name}: {missing}"


def test_the_skeleton_is_about_150_lines_and_covers_publish_ack_and_the_drain_visit() -> None:
    blocks = skeleton_blocks()
    assert 100 <= sum(len(b.splitlines()) for b in blocks) <= 200
    joined = "\n".join(blocks)
    for what in ("async def publish", "async def ack", "async def visit", "DEPTH", "ThreadBridge()"):
        assert what in joined
