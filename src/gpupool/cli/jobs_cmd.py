"""The daemon's job commands: submit, ps, logs, cancel, wait, describe, drain (HTTP client)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import typer

from gpupool.api.client import Client
from gpupool.cli import jobs_view, options
from gpupool.core.errors import InvalidRequest
from gpupool.core.units import MILLI_PER_GPU, parse_compute_percent, parse_memory_share

POLL_S = 0.2


def _env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidRequest(f"invalid --env {pair!r}: use KEY=VALUE")
        env[key] = value
    return env


def _body(
    command: list[str],
    gpus: int,
    memory: str | None,
    compute: str | None,
    mode: str,
    priority: str | None,
    gpu_model: str | None,
    name: str,
    env: list[str],
    workdir: str | None,
) -> dict[str, Any]:
    if memory is not None:
        parse_memory_share(memory)  # bad input stops here, before the daemon is asked
    milli = parse_compute_percent(compute) if compute is not None else MILLI_PER_GPU
    models = [m.strip() for m in gpu_model.split(",") if m.strip()] if gpu_model else []
    body: dict[str, Any] = {
        "argv": command,
        "gpus": gpus,
        "memory": memory,
        "compute": milli * 100 // MILLI_PER_GPU,
        "mode": mode,
        "gpu_models": models,
        "name": name,
        "env": _env(env),
        "workdir": os.path.abspath(workdir or os.getcwd()),
    }
    if priority is not None:  # else the daemon's default
        body["priority"] = priority
    return body


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2))


def follow(client: Client, job_id: int) -> dict[str, Any]:
    """Copy the job's output here until it ends; its final record."""
    offsets = {"stdout": 0, "stderr": 0}
    while True:
        finished = True
        for stream, sink in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            chunk = client.call(
                "GET",
                f"/v1/jobs/{job_id}/logs",
                params={"stream": stream, "offset": offsets[stream]},
            )
            if chunk["data"]:
                sink.write(chunk["data"])
                sink.flush()
            finished &= bool(chunk["finished"]) and chunk["offset"] == offsets[stream]
            offsets[stream] = chunk["offset"]
        if finished:
            return client.call("GET", f"/v1/jobs/{job_id}")
        time.sleep(POLL_S)


def _read_all(client: Client, job_id: int, stream: str) -> str:
    parts, offset = [], 0
    while True:
        chunk = client.call(
            "GET", f"/v1/jobs/{job_id}/logs", params={"stream": stream, "offset": offset}
        )
        parts.append(chunk["data"])
        if chunk["offset"] == offset:
            return "".join(parts)
        offset = chunk["offset"]


def _wait_for(client: Client, job_id: int) -> dict[str, Any]:
    while True:
        job = client.call("GET", f"/v1/jobs/{job_id}")
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(POLL_S)


def _code(job: dict[str, Any]) -> int:
    code = job.get("exit_code")
    if code is None:
        return 0 if job["state"] == "succeeded" else 1
    return int(code)


def register(app: typer.Typer) -> None:
    """Add the job commands to the app."""

    @app.command("submit", context_settings={"allow_interspersed_args": False})
    def submit(
        command: list[str] = typer.Argument(..., metavar="CMD", help="The command, after --."),
        gpus: int = typer.Option(1, "--gpus", metavar="N", help="GPUs (same share on each)."),
        memory: str | None = options.MEMORY,
        compute: str | None = options.COMPUTE,
        mode: str | None = typer.Option(
            None,
            "--mode",
            metavar="shim|mps|exclusive|mig",
            help="Default shim (mig with a profile).",
        ),
        mig_profile: str | None = typer.Option(
            None, "--mig-profile", metavar="PROFILE", help="Mode mig: the instance, e.g. 1g.10gb."
        ),
        priority: str | None = options.PRIORITY,
        gpu_model: str | None = typer.Option(None, "--gpu-model", metavar="A100,H100"),
        name: str = typer.Option("", "--name"),
        env: list[str] = typer.Option([], "--env", metavar="K=V", help="Repeatable."),
        workdir: str | None = typer.Option(None, "--workdir", metavar="DIR"),
        wait: bool = typer.Option(False, "--wait", help="Follow its output, exit with its code."),
        url: str | None = options.URL,
        as_json: bool = options.JSON,
    ) -> None:
        """Queue a command on the node's GPUs; prints the job id.

        Without --memory, a job gets the share of each GPU's memory that --compute gives it.
        """
        if gpus < 1:
            raise InvalidRequest(f"invalid --gpus {gpus}: must be at least 1")
        mode = mode or ("mig" if mig_profile is not None else "shim")
        body = _body(command, gpus, memory, compute, mode, priority, gpu_model, name, env, workdir)
        body["mig_profile"] = mig_profile
        with Client(url) as client:
            job = client.call("POST", "/v1/jobs", json=body)["job"]
            if as_json and not wait:
                _echo_json({"job": job})
            elif not wait:
                typer.echo(job["id"])
            if wait:
                final = follow(client, job["id"])
                if as_json:
                    _echo_json({"job": final})
                raise typer.Exit(_code(final))

    @app.command("ps")
    def ps(
        everything: bool = typer.Option(False, "--all", "-a", help="Finished jobs too."),
        url: str | None = options.URL,
        as_json: bool = options.JSON,
    ) -> None:
        """List the daemon's jobs (queued and running; --all for finished ones too)."""
        with Client(url) as client:
            jobs = client.call("GET", "/v1/jobs", params={"all": everything})["jobs"]
        if as_json:
            _echo_json({"jobs": jobs})
        else:
            jobs_view.print_jobs(jobs)

    @app.command("logs")
    def logs(
        job_id: int = typer.Argument(..., metavar="JOB"),
        follow_: bool = typer.Option(False, "--follow", "-f", help="Until the job ends."),
        url: str | None = options.URL,
        as_json: bool = options.JSON,
    ) -> None:
        """Print a job's output (stdout here, stderr on stderr)."""
        with Client(url) as client:
            if follow_ and not as_json:
                follow(client, job_id)
                return
            texts = {stream: _read_all(client, job_id, stream) for stream in ("stdout", "stderr")}
        if as_json:
            _echo_json({"id": job_id, **texts})
            return
        sys.stdout.write(texts["stdout"])
        sys.stdout.flush()
        sys.stderr.write(texts["stderr"])

    @app.command("cancel")
    def cancel(
        job_ids: list[int] = typer.Argument(..., metavar="JOB..."),
        url: str | None = options.URL,
        as_json: bool = options.JSON,
    ) -> None:
        """Cancel jobs: SIGTERM to each job's process group, SIGKILL after a grace period."""
        with Client(url) as client:
            jobs = [client.call("POST", f"/v1/jobs/{j}/cancel")["job"] for j in job_ids]
        if as_json:
            _echo_json({"jobs": jobs})
        else:
            for job in jobs:
                typer.echo(f"job {job['id']}: cancel sent ({job['state']})")

    @app.command("wait")
    def wait(
        job_ids: list[int] = typer.Argument(..., metavar="JOB..."),
        url: str | None = options.URL,
        as_json: bool = options.JSON,
    ) -> None:
        """Wait for jobs to end; exits with the first non-zero exit code, else 0."""
        with Client(url) as client:
            jobs = [_wait_for(client, j) for j in job_ids]
        if as_json:
            _echo_json({"jobs": jobs})
        raise typer.Exit(next((_code(j) for j in jobs if _code(j) != 0), 0))

    @app.command("describe")
    def describe(
        job_id: int = typer.Argument(..., metavar="JOB"),
        url: str | None = options.URL,
        as_json: bool = options.JSON,
    ) -> None:
        """A job's share, placement, events and, while queued, why it waits."""
        with Client(url) as client:
            job = client.call("GET", f"/v1/jobs/{job_id}")
        if as_json:
            _echo_json(job)
        else:
            jobs_view.print_job(job)

    @app.command("drain")
    def drain(
        off: bool = typer.Option(False, "--off", help="Start new jobs again."),
        url: str | None = options.URL,
        as_json: bool = options.JSON,
    ) -> None:
        """Start nothing new; running jobs finish (--off: back to normal)."""
        with Client(url) as client:
            node = client.call("POST", "/v1/drain", json={"on": not off})
        if as_json:
            _echo_json(node)
        elif node["draining"]:
            typer.echo("draining: nothing new starts; running jobs finish")
        else:
            typer.echo("not draining: queued jobs start as room frees")
