"""What the model-based tests (Hypothesis state machines over a real broker) share."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

# The same examples every run, no example database, no shrinking: a failure is reported
# as found (its steps are printed), since shrinking real brokers is slow.
MODEL_SETTINGS = settings(
    max_examples=25,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
