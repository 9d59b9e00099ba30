"""The PySpark connector through a real Spark: a package, so that its conftest.py is
spark.conftest beside the top-level tests/conftest.py (mypy checks both)."""
