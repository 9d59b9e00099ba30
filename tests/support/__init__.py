"""What the tests of every layer share, imported as `support.<module>` (pytest puts tests/
on sys.path: `pythonpath` in pyproject.toml; mypy finds it through `mypy_path`).

- `helpers`: the CLI through CliRunner, JSON lines, stored rows, real subprocesses.
- `servers`: a Server in a thread, a real `fencelog serve`, raw frames over a socket.
- `owning`, `producing`, `exclusive`: what the ownership, idempotent-producer and
  exclusive-producer tests share.
- `mixed_logs`: a partition log with every kind of record.
- `txn_copier.py`, `spark_driver.py`: programs the tests run as subprocesses, by path
  (`SCRIPTS / "txn_copier.py"`), never imported.
"""

from __future__ import annotations

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
"""Where the programs run as `python PATH` live (this package's directory)."""

REPO_ROOT = SCRIPTS.parents[1]
EXAMPLES = REPO_ROOT / "examples"
