"""What the README documents."""

from __future__ import annotations

import re

from support.paths import ROOT


def documented() -> set[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(stallwatch_\w+)` \|", section, re.MULTILINE))
