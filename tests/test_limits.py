"""The daemon lifts its soft open-file limit to the hard one (one fd per partition)."""
from __future__ import annotations

import subprocess
import sys


def test_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    code = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "from kmqkafka.tap import raise_open_file_limit\n"
        "now = raise_open_file_limit()\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == now, now\n"
        "print(now, hard)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    now, hard = (int(x) for x in out.stdout.split())
    assert now == (hard if hard != -1 else max(256, 1 << 20))
