"""How a measuring step talks to the check: one line per result, printed the moment it exists.

`emit` prints `@@ {json}` and flushes, so a step ended by its timeout has already handed over
every result it finished; `read` takes them back out of the step's log.
"""

from __future__ import annotations

import json

MARK = "@@ "


def emit(**fields) -> None:
    print(MARK + json.dumps(fields, sort_keys=True), flush=True)


def read(text: str) -> list[dict]:
    return [json.loads(ln[len(MARK):]) for ln in text.splitlines() if ln.startswith(MARK)]
