"""python -m chaos [--seed N] [--duration S] [--keep DIR]: one fault-suite run.

Exit 0 when the run found no anomaly, 1 when it did (they are listed), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
from pathlib import Path
from types import FrameType

from chaos.run import run


def _stop(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM ends a run as Ctrl-C does: every process it started is stopped."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument("--keep", type=Path, default=None, help="work here and keep the files")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    tally = run(seed, args.duration, keep=args.keep)
    if tally.anomalies:
        print(f"chaos: FAILED with {sum(tally.anomalies.values())} anomalies (seed {seed})")
        return 1
    print(f"chaos: clean (seed {seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
