"""The names the shipped dashboard and alert rules read, as tests/promql.py finds them in
PromQL (the live check against a scrape is tests/integration/test_deploy_metrics.py)."""

from __future__ import annotations

import pytest

from tests.promql import dashboard_exprs, names, rule_exprs


@pytest.mark.parametrize(("expr", "metrics", "labels"), [
    ("timers_dead", {"timers_dead"}, set()),
    ("sum by (group) (timers_overdue) > 0", {"timers_overdue"}, {"group"}),
    ("sum(timers_pending) by (group, priority)", {"timers_pending"}, {"group", "priority"}),
    ("histogram_quantile(0.99, sum by (group, le) "
     "(rate(timers_lateness_seconds_bucket[$__rate_interval]))) > 1e3",
     {"timers_lateness_seconds_bucket"}, {"group", "le"}),
    ('timers_runs_total{outcome="dead", task=~"a.(b)"} offset 5m',
     {"timers_runs_total"}, {"outcome", "task"}),
    ("max by (group) (timers_pending) > 0 and on (group) "
     "max by (group) (timers_listeners_serving) == bool 0",
     {"timers_pending", "timers_listeners_serving"}, {"group"}),
    ("a:b:rate5m / ignoring (x) group_left (y) c unless d",
     {"a:b:rate5m", "c", "d"}, {"x", "y"}),
    ('label_replace(up, "dst", "$1", "src", "(.*)")', {"up"}, set()),
    ("rate(x[5m:30s]) - max_over_time(y[1h])", {"x", "y"}, set()),
])
def test_names_finds_metrics_and_labels_not_functions_keywords_or_strings(
        expr: str, metrics: set[str], labels: set[str]) -> None:
    assert names(expr) == (metrics, labels)


def test_the_dashboard_and_the_rules_are_read_whole() -> None:
    rules, queries = rule_exprs(), dashboard_exprs()
    assert len(rules) == 6 and len(queries) >= 16
    read = set().union(*(names(e)[0] for e in rules + queries))
    assert {"timers_overdue", "timers_listeners_serving", "timers_keyspace_failed_total",
            "timers_lateness_seconds_bucket", "timers_runs_total"} <= read
    assert all(name.startswith("timers_") for name in read)
