"""fencelog's fault suite: `make chaos` (python -m chaos --seed N --duration S).

Idempotent producers and a transactional copier against a server that is killed and
restarted, through a proxy that cuts, delays and black-holes connections; an owner and
an exclusive producer paused with SIGSTOP, outside and inside a write transaction. Each
run ends with `fencelog verify` over what was written and prints the operations, the
faults injected and the anomalies found (chaos/run.py). Loopback only, seeded, bounded,
and every process it starts is stopped.
"""
