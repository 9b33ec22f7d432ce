"""Cost of the raw-body checks a request pays before parsing (kvstrata/serving/body_scan.py), and of
the regex checks they replaced (`--before REV`: that revision's kvstrata/serving/limits.py, read with
`git show`), on the same machine in one run.

Bodies: 8 MiB of one prompt string with escapes, 8 MiB of many small messages, and the hostile shape
from issue 26 (an unterminated string of `\\"`) at 4, 8 and 16 KB (the old regex is quadratic in it:
run no larger) and at 8 MiB for the new scan only. Prints the best of 3 runs per body.

    PYTHONPATH=. python bench/body_check_cost.py --before d44a3e6
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time
import types
from typing import Callable

from kvstrata.serving.body_scan import scan_body

MiB = 1 << 20


def old_checks(rev: str) -> Callable[[bytes], object]:
    source = subprocess.run(["git", "show", f"{rev}:kvstrata/serving/limits.py"], capture_output=True, text=True,
                            check=True).stdout
    module = types.ModuleType("limits_before")
    exec(compile(source, f"{rev}:limits.py", "exec"), module.__dict__)  # noqa: S102 - our own file at REV
    return lambda body: (module.json_depth(body), module.has_lone_surrogate(body))


def best_ms(check: Callable[[bytes], object], body: bytes, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        check(body)
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def bodies() -> dict[str, bytes]:
    prompt = ('the quick brown fox said "hi" \\ then left. ' * 200_000)[:7_800_000]
    one = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 4}).encode()
    many = json.dumps({"messages": [{"role": "user", "content": "x" * 60} for _ in range(8 * MiB // 94)]}).encode()
    assert len(one) <= 8 * MiB and len(many) <= 8 * MiB
    out = {"8 MiB, one prompt string": one, "8 MiB, many small messages": many}
    for kb in (4, 8, 16):
        out[f"{kb} KB unterminated \\\" run"] = b'{"prompt": "' + b'"' + b'\\"' * (kb * 1000 // 2)
    out["8 MiB unterminated \\\" run"] = b'{"prompt": "' + b'"' + b'\\"' * (8 * MiB // 2 - 8)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=None, help="revision whose limits.py regex checks to measure too")
    args = parser.parse_args()
    before = old_checks(args.before) if args.before else None
    for name, body in bodies().items():
        line = f"{name:32s} after {best_ms(scan_body, body):9.1f} ms"
        if before is not None and not name.startswith("8 MiB unterminated"):  # quadratic: hours
            line += f"   before {best_ms(before, body, runs=1 if 'KB' in name else 3):9.1f} ms"
        print(line, flush=True)


if __name__ == "__main__":
    main()
