"""Metric families as /metrics builds them, and their Prometheus text format (0.0.4).

prometheus_client's families keep a dict of labels per sample, and its `generate_latest` checks
every metric and label name of every sample against regular expressions before formatting it
through several calls: with 100 running jobs on 8 GPUs (about 900 samples) that was most of a
scrape. Here a sample is its label values and its value; the names are the collector's own
constants, valid by construction, so only label values are escaped, and a job's labels on a GPU,
shared by five of its families, are formatted once a scrape. `render` writes the same bytes as
`generate_latest` over `to_metric()` of the same families; a test compares the two.
`to_metric()` is the prometheus_client view, for a `Collector`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import utils
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from gpupool.agent.observe import HistogramReading

#: a sample's value as the text format writes it (Go's float formatting), prometheus_client's own
_value: Callable[[float], str] = utils.floatToGoString
#: formatted label sets of one render, by label names and then by values
_Formatted = dict[tuple[str, ...], dict[tuple[str, ...], str]]


def _escape(text: str) -> str:
    """A label value as the text format quotes it (most need nothing: test before replacing)."""
    if "\\" in text or "\n" in text or '"' in text:
        return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return text


def _header(name: str, doc: str, kind: str) -> str:
    doc = doc.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


@dataclass
class Family:
    """A gauge or counter family: one (label values, value) per sample, in `labels`' order."""

    name: str
    doc: str
    kind: Literal["gauge", "counter"]
    labels: tuple[str, ...] = ()
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

    def add(self, values: tuple[str, ...], value: float) -> None:
        self.samples.append((values, value))

    def to_metric(self) -> Metric:
        metric: GaugeMetricFamily | CounterMetricFamily
        if self.kind == "counter":
            metric = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        else:
            metric = GaugeMetricFamily(self.name, self.doc, labels=self.labels)
        for values, value in self.samples:
            metric.add_metric(values, value)
        return metric

    def write(self, lines: list[str], formatted: _Formatted) -> None:
        name = f"{self.name}_total" if self.kind == "counter" else self.name
        lines.append(_header(name, self.doc, self.kind))
        # the text format sorts a sample's labels by name
        order = sorted(range(len(self.labels)), key=self.labels.__getitem__)
        names = [self.labels[i] for i in order]
        known = formatted.setdefault(self.labels, {})
        for values, value in self.samples:
            labels = known.get(values)
            if labels is None:
                pairs = ",".join(
                    f'{label}="{_escape(values[i])}"' for label, i in zip(names, order, strict=True)
                )
                labels = known[values] = f"{{{pairs}}}" if pairs else ""
            lines.append(f"{name}{labels} {_value(value)}\n")


@dataclass
class Histogram:
    """A histogram family of no labels, from an agent histogram's reading."""

    name: str
    doc: str
    reading: HistogramReading

    def _buckets(self) -> list[tuple[str, int]]:
        return [("+Inf" if b == float("inf") else repr(b), n) for b, n in self.reading.buckets]

    def to_metric(self) -> Metric:
        return HistogramMetricFamily(
            self.name, self.doc, buckets=self._buckets(), sum_value=self.reading.total
        )

    def write(self, lines: list[str], _formatted: _Formatted) -> None:
        lines.append(_header(self.name, self.doc, "histogram"))
        buckets = self._buckets()
        lines.extend(
            f'{self.name}_bucket{{le="{bound}"}} {_value(count)}\n' for bound, count in buckets
        )
        lines.append(f"{self.name}_count {_value(buckets[-1][1])}\n")
        lines.append(f"{self.name}_sum {_value(self.reading.total)}\n")


def render(families: Iterable[Family | Histogram]) -> bytes:
    """`families` in the text format, UTF-8."""
    lines: list[str] = []
    formatted: _Formatted = {}
    for family in families:
        family.write(lines, formatted)
    return "".join(lines).encode()
