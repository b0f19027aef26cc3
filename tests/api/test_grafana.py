"""deploy/grafana/gpupool.json: every query parses as PromQL and names only exported metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from gpupool.agent.agent import Agent, AgentConfig
from gpupool.api.metrics import AgentCollector
from gpupool.devices.factory import open_backend

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpupool.json"
#: Grafana's own variables, as Grafana substitutes them before a query reaches Prometheus
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def exported_names(tmp_path: Path) -> set[str]:
    """What the daemon's collector exports, histograms and counters as their series names."""
    (tmp_path / "state").mkdir()
    with open_backend("1xA30", tmp_path / "node") as backend:
        agent = Agent(AgentConfig(tmp_path / "state"), backend)
        names = set()
        for family in AgentCollector(agent.view).collect():
            if isinstance(family, HistogramMetricFamily):
                names |= {f"{family.name}{end}" for end in ("_bucket", "_sum", "_count")}
            elif isinstance(family, CounterMetricFamily):
                names.add(f"{family.name}_total")
            else:
                names.add(family.name)
        agent.store.close()
    return names


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expression) of every panel target and query variable."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for item in items:
            yield item
            yield from panels(item.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            inner = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query)
            assert inner, f"variable {variable['name']}: unexpected query {query}"
            yield f"variable {variable['name']}", inner.group(1)


def metric_names(node: Any) -> Iterator[str]:
    """Every metric a PromQL syntax tree selects."""
    if isinstance(node, promql_parser.VectorSelector):
        assert node.name, "a selector without a metric name"
        yield node.name
    elif isinstance(node, promql_parser.MatrixSelector):
        yield from metric_names(node.vector_selector)
    elif isinstance(node, promql_parser.BinaryExpr):
        yield from metric_names(node.lhs)
        yield from metric_names(node.rhs)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from metric_names(arg)
    elif isinstance(
        node,
        promql_parser.AggregateExpr
        | promql_parser.ParenExpr
        | promql_parser.UnaryExpr
        | promql_parser.SubqueryExpr,
    ):
        yield from metric_names(node.expr)
    else:
        assert isinstance(node, promql_parser.NumberLiteral | promql_parser.StringLiteral), node


def test_every_query_parses_and_names_an_exported_metric(tmp_path: Path) -> None:
    exported = exported_names(tmp_path)
    dashboard = json.loads(DASHBOARD.read_text())
    found = list(queries(dashboard))
    assert len(found) >= 15
    used: set[str] = set()
    for where, expr in found:
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        names = set(metric_names(promql_parser.parse(expr)))
        assert names, f"{where}: {expr} selects no metric"
        assert names <= exported, f"{where}: {sorted(names - exported)} not exported"
        used |= names
    assert "DCGM_FI_DEV_GPU_UTIL" in used and "vGPU_device_memory_usage_in_bytes" in used


def test_the_walk_catches_an_unknown_metric() -> None:
    tree = promql_parser.parse('sum(rate(nope_total{gpu="0"}[1m])) / on() DCGM_FI_DEV_FB_USED')
    assert set(metric_names(tree)) == {"nope_total", "DCGM_FI_DEV_FB_USED"}
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(DCGM_FI_DEV_FB_USED[1m])")


def test_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        grid = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert grid["x"] + grid["w"] <= 24 and not cells & taken, panel["title"]
        taken |= cells
