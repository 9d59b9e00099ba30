"""fencelog's benchmarks: `make bench` (python -m bench.run) measures fencelog against
plain SQLite on the same machine, in the same run, and records the figures in
bench/RESULTS.md, one section per benchmark group."""
