"""`gpupool sim` and `gpupool demo`: replay a trace through placement policies, compare them."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpupool.cli import options
from gpupool.cli.lines import say
from gpupool.core.errors import InvalidRequest, TraceFormatError
from gpupool.core.units import parse_int_range
from gpupool.scheduler import POLICY_NAMES
from gpupool.sim import report, synthetic, trace
from gpupool.sim.metrics import HEADLINE_PCTS
from gpupool.sim.report import ComparisonRow
from gpupool.sim.runner import Progress as ProgressCallback
from gpupool.sim.runner import RunResult, Scenario, check_policies, plan, run_many

DEMO_POLICIES = ("random", "bestfit", "fgd", "gpupool")
DEMO_SEEDS = "42-44"
DEMO_OUT = Path("out") / "demo"


def parse_policies(text: str) -> list[str]:
    """`fgd,bestfit` -> ["fgd", "bestfit"]; `all` -> every policy; unknown names are refused."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise InvalidRequest(
            f"invalid policy list {text!r}; valid policies: all, {', '.join(POLICY_NAMES)}"
        )
    if "all" in names:
        return list(POLICY_NAMES)
    check_policies(names)
    return list(dict.fromkeys(names))


def parse_seeds(text: str) -> list[int]:
    """`42-51` or `1,3,5-6`; seeds are numpy generator seeds, so 0 or more."""
    seeds = parse_int_range(text, "seed range")
    negative = [seed for seed in seeds if seed < 0]
    if negative:
        raise InvalidRequest(f"invalid seed {negative[0]} in {text!r}: seeds are 0 or more")
    return seeds


@dataclass(frozen=True)
class SimJob:
    """What one `sim` or `demo` call runs and where its outputs go."""

    scenario: Scenario
    workload: str
    policies: list[str]
    seeds: list[int]
    jobs: int
    out: Path | None
    compare: Path | None


def _resolve_scenario(trace_dir: Path | None, use_synthetic: bool) -> Scenario:
    if use_synthetic:
        if trace_dir is not None:
            raise InvalidRequest("--synthetic and --trace-dir exclude each other: give one")
        return Scenario(trace_dir=None)
    if trace_dir is not None:
        return Scenario(trace_dir=trace_dir)
    found = trace.default_trace_dir()
    if found is None:
        raise TraceFormatError(
            f"no --trace-dir given and no trace at {trace.DEFAULT_TRACE_RELPATH}; download it "
            f"from {trace.TRACE_URL}, or pass --synthetic"
        )
    return Scenario(trace_dir=found)


@contextmanager
def _progress(console: Console, enabled: bool, total: int) -> Iterator[ProgressCallback | None]:
    if not enabled:
        yield None
        return
    bar = Progress(
        TextColumn("replaying"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = bar.add_task("", total=total)

    def advance(done: int, _total: int, result: RunResult) -> None:
        spec = result.spec
        bar.update(task, completed=done, description=f"{spec.policy} seed {spec.seed}")

    with bar:
        yield advance


def _run(job: SimJob, console: Console, show_progress: bool) -> list[RunResult]:
    job.scenario.check_workload(job.workload)
    for line in job.scenario.never_placed(job.workload):
        typer.echo(f"gpupool: warning: {line}", err=True)
    specs = plan([job.workload], job.policies, job.seeds)
    try:
        with _progress(console, show_progress, len(specs)) as progress:
            return run_many(job.scenario, specs, jobs=job.jobs, progress=progress)
    except KeyboardInterrupt:
        typer.echo("gpupool: interrupted", err=True)
        raise typer.Exit(130) from None


def _comparison(job: SimJob, results: Sequence[RunResult]) -> list[ComparisonRow]:
    if job.compare is None:
        return []
    return report.compare(results, report.load_published(job.compare, job.workload))


def _fmt(value: float, digits: int = 2, signed: bool = False) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _results_table(results: Sequence[RunResult], title: str) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("policy", no_wrap=True)
    table.add_column("seeds", justify="right")
    for pct in HEADLINE_PCTS:
        table.add_column(f"{pct}%", justify="right", no_wrap=True)
    table.add_column("failed", justify="right", no_wrap=True)
    table.add_column("s/run", justify="right", no_wrap=True)
    for policy, points in report.mean_by_policy(results).items():
        runs = [r for r in results if r.spec.policy == policy]
        failed = sum(r.failed_pods for r in runs) / len(runs)
        seconds = sum(r.seconds for r in runs) / len(runs)
        table.add_row(
            policy,
            str(len(runs)),
            *(_fmt(points[pct]) for pct in HEADLINE_PCTS),
            f"{failed:.0f}",
            f"{seconds:.1f}",
        )
    return table


def _comparison_table(rows: Sequence[ComparisonRow], source: Path) -> Table:
    table = Table(
        title=f"unallocated GPU %: ours (mean ± sd over seeds) vs published ({source.name})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for name in ("policy", "arrived %", "ours", "published", "delta"):
        table.add_column(name, justify="left" if name == "policy" else "right", no_wrap=True)
    for index, row in enumerate(rows):
        last_of_policy = index + 1 == len(rows) or rows[index + 1].policy != row.policy
        table.add_row(
            row.policy,
            str(row.arrived_pct),
            f"{_fmt(row.ours_mean)} ± {_fmt(row.ours_sd)}",
            f"{_fmt(row.published_mean)} ± {_fmt(row.published_sd)}",
            _fmt(row.delta, signed=True),
            end_section=last_of_policy,
        )
    return table


def _print_comparison(console: Console, rows: Sequence[ComparisonRow], source: Path) -> None:
    published = [row for row in rows if not math.isnan(row.published_mean)]
    if published:
        console.print(_comparison_table(published, source))
    have = {row.policy for row in published}
    missing = list(dict.fromkeys(row.policy for row in rows if row.policy not in have))
    if missing:
        console.print(f"no published values in {source.name} for: {', '.join(missing)}")


def _title(job: SimJob) -> str:
    return f"workload {job.workload} on the {job.scenario.describe()}"


def execute(job: SimJob, *, as_json: bool) -> None:
    """Run the job, write its outputs, print the JSON object or the tables."""
    err = Console(stderr=True)
    if job.out is not None:
        report.check_plotting()
    # A live bar helps in a terminal; in a log or a pipe it is noise.
    results = _run(job, err, show_progress=err.is_terminal)
    comparison = _comparison(job, results)
    written = report.write_outputs(job.out, results, _title(job), comparison) if job.out else []
    if as_json:
        say(json.dumps(report.summary(results)))
        return
    # Off a terminal rich assumes 80 columns, too narrow for the table in a log or a pipe.
    out = Console() if sys.stdout.isatty() else Console(width=100)
    out.print(_results_table(results, f"unallocated GPU % at arrived %: {_title(job)}"))
    if comparison and job.compare is not None:
        _print_comparison(out, comparison, job.compare)
    for path in written:
        out.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add `sim` and `demo` to the app."""

    @app.command("sim")
    def sim(
        trace_dir: Path | None = typer.Option(
            None,
            "--trace-dir",
            help="Trace folder (holding csv/ or the CSV files); default: "
            "../shared/traces/alibaba-gpu-v2023 beside the current directory or the checkout.",
        ),
        workload: str | None = typer.Option(
            None, "--workload", help="NAME for openb_pod_list_NAME.csv (default: default)."
        ),
        policy: str = typer.Option(
            "fgd,gpupool", "--policy", help=f"Comma list or 'all' ({', '.join(POLICY_NAMES)})."
        ),
        seeds: str = typer.Option("42", "--seeds", help="Seeds: N, N-M or a comma list."),
        out: Path | None = typer.Option(
            None, "--out", help="Write curves.csv, summary.json and unallocated.png here."
        ),
        as_json: bool = options.typer_option(options.JSON),
        compare: Path | None = typer.Option(
            None, "--compare", help="Published CSV (fgd_published_default.csv format)."
        ),
        jobs: int = typer.Option(0, "--jobs", help="Parallel processes (0: one per core)."),
        use_synthetic: bool = typer.Option(
            False, "--synthetic", help="Replay the built-in synthetic cluster, not the trace."
        ),
    ) -> None:
        """Replay a workload of the Alibaba GPU trace through placement policies (FGD paper).

        With --json, stdout holds exactly one JSON object: the summary.
        """
        default_workload = synthetic.SYNTHETIC_WORKLOAD if use_synthetic else "default"
        job = SimJob(
            scenario=_resolve_scenario(trace_dir, use_synthetic),
            workload=workload or default_workload,
            policies=parse_policies(policy),
            seeds=parse_seeds(seeds),
            jobs=jobs,
            out=out,
            compare=compare,
        )
        execute(job, as_json=as_json)

    @app.command("demo")
    def demo(
        out: Path = typer.Option(DEMO_OUT, "--out", help="Where the plot and CSVs go."),
        seeds: str = typer.Option(DEMO_SEEDS, "--seeds", help="Seeds: N, N-M or a comma list."),
        jobs: int = typer.Option(0, "--jobs", help="Parallel processes (0: one per core)."),
        trace_dir: Path | None = typer.Option(
            None,
            "--trace-dir",
            help="Trace folder; default: ../shared/traces/alibaba-gpu-v2023. Without a trace "
            "the demo runs on a synthetic cluster.",
        ),
    ) -> None:
        """Compare random, bestfit, fgd and gpupool on the trace (or a synthetic cluster)."""
        job = _demo_job(out, parse_seeds(seeds), jobs, trace_dir)
        execute(job, as_json=False)


def _demo_job(out: Path, seeds: list[int], jobs: int, trace_dir: Path | None) -> SimJob:
    """The trace's `default` workload when the trace is there, else the synthetic cluster;
    either way the choice is announced on stderr."""
    found = trace_dir if trace_dir is not None else trace.default_trace_dir()
    looked_at = trace_dir if trace_dir is not None else trace.DEFAULT_TRACE_RELPATH
    if (
        found is None
        or not found.is_dir()
        or not (trace.csv_dir(found) / trace.NODE_FILE).is_file()
    ):
        typer.echo(f"trace not found at {looked_at}: running on a synthetic cluster", err=True)
        scenario, workload, compare = Scenario(trace_dir=None), synthetic.SYNTHETIC_WORKLOAD, None
    else:
        typer.echo(f"running on the Alibaba GPU trace at {found} (workload default)", err=True)
        scenario, workload = Scenario(trace_dir=found), "default"
        compare = trace.find_beside(report.DEFAULT_PUBLISHED_RELPATH)
    return SimJob(
        scenario=scenario,
        workload=workload,
        policies=list(DEMO_POLICIES),
        seeds=seeds,
        jobs=jobs,
        out=out,
        compare=compare,
    )
