"""What slurmctld gave a job on a node: its GPU gres, from `scontrol show job -d` (as root: not
the job's word). Light: the Prolog imports it before anything else."""

from __future__ import annotations

import re
import subprocess

from gpupool.core.errors import ConfigError

#: (kind, count, GPU indices): ("shard", 3, (0,)) or ("gpu", 2, (0, 1))
Gres = tuple[str, int, tuple[int, ...]]
#: `GRES=shard:3(IDX:0)` or `GRES=gpu:2(IDX:0-1)` on the job's line for a node
_GRES = re.compile(r"\b(shard|gpu):(?:[^:(,\s]+:)?(\d+)\(IDX:([0-9,-]+)\)")
_NODES = re.compile(r"^\s*Nodes=(\S+)\s.*GRES=(\S+)", re.MULTILINE)


def _indices(text: str) -> tuple[int, ...]:
    found: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        found += range(int(low), int(high or low) + 1)
    return tuple(found)


def job_gres(scontrol_text: str, node: str) -> Gres | None:
    """(kind, count, GPU indices) of the job's GPU gres on `node`, from `scontrol show job -d`;
    None when it holds none there."""
    lines = _NODES.findall(scontrol_text)
    mine = [gres for nodes, gres in lines if nodes == node] or (
        [lines[0][1]] if len(lines) == 1 else []
    )
    for gres in mine:
        found = _GRES.search(gres)
        if found is not None:
            return found.group(1), int(found.group(2)), _indices(found.group(3))
    return None


def read_gres(job_id: int, node: str) -> Gres | None:
    """What slurmctld gave job `job_id` on `node` (scontrol as root: not the job's word)."""
    try:
        done = subprocess.run(
            ["scontrol", "show", "job", "-d", str(job_id)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise ConfigError(f"cannot ask slurmctld about job {job_id}: {err}") from err
    return job_gres(done.stdout, node)
