"""Writes tests/durations.json from a `pytest --durations=0` log.

    make test PYTEST_ARGS="-n 3 --dist loadfile --no-loadscope-reorder \\
        --durations=0" | tee /tmp/suite.log
    python tests/record_durations.py /tmp/suite.log

tests/conftest.py runs the files longest first from it. Seconds per file
are the sum of its tests' setup, call and teardown times as pytest printed
them (what one worker spent on the file).
"""

from __future__ import annotations

import json
import os
import re
import sys

LINE = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(\S+?)::")


def per_file(lines) -> dict:
    files: dict = {}
    for line in lines:
        match = LINE.match(line)
        if match:
            seconds, _, path = match.groups()
            files[path] = files.get(path, 0.0) + float(seconds)
    return {k: round(v, 1) for k, v in sorted(files.items())}


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    with open(argv[1]) as f:
        files = per_file(f)
    if not files:
        print(f"no durations in {argv[1]}: run pytest with --durations=0")
        return 1
    out = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "durations.json"
    )
    with open(out, "w") as f:
        json.dump(
            {
                "note": "seconds per test file; tests/record_durations.py",
                "files": files,
            },
            f,
            indent=1,
        )
        f.write("\n")
    print(f"{len(files)} files, {sum(files.values()):.0f} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
