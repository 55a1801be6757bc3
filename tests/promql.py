"""The metric and label names a PromQL expression reads, and the expressions of the shipped
Grafana dashboard and Prometheus rules (docs/deploy/): what tests check against a scrape.

Enough of PromQL for expressions written by hand: names are the identifiers not called as
functions, outside strings, label matchers' values, durations and keywords; labels are
those of matchers and of ``by``/``without``/``on``/``ignoring``/``group_left``/``group_right``
lists."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT

DEPLOY = ROOT / "docs" / "deploy"
DASHBOARD = DEPLOY / "timers-dashboard.json"
RULES = DEPLOY / "timers-alerts.yml"
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan", "atan2"}
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"\{([^}]*)\}")
_IDENT = re.compile(r"(?<![\w:.$])[A-Za-z_:][\w:]*")


def names(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names ``expr`` reads."""
    expr = _STRING.sub('""', expr)
    labels: set[str] = set()
    for listed in _LIST.findall(expr):
        labels.update(x.strip() for x in listed.split(",") if x.strip())
    expr = _LIST.sub(" ", expr)
    for matchers in _MATCHERS.findall(expr):
        labels.update(m.group(0) for m in re.finditer(r"[A-Za-z_]\w*(?=\s*(?:=~|!~|!=|=))",
                                                      matchers))
    expr = _MATCHERS.sub(" ", re.sub(r"\[[^\]]*\]", " ", expr))
    metrics = set()
    for found in _IDENT.finditer(expr):
        called = expr[found.end():].lstrip().startswith("(")
        if not called and found.group(0) not in KEYWORDS:
            metrics.add(found.group(0))
    return metrics, labels


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _exprs(value)


def dashboard_exprs(path: Path = DASHBOARD) -> list[str]:
    """Every query of the Grafana dashboard (``$__rate_interval`` as Grafana leaves it)."""
    return list(_exprs(json.loads(path.read_text())))


def rule_exprs(path: Path = RULES) -> list[str]:
    """Every rule's ``expr`` in a Prometheus rules file."""
    return [rule["expr"] for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]
