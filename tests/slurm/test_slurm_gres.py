"""Reading what slurmctld gave a job on a node, from `scontrol show job -d` (no cluster)."""

from __future__ import annotations

from gpupool.slurm.gres import job_gres

SHOW = """JobId=12 JobName=wrap
   JOB_GRES=shard:3
     Nodes=gpu01 CPU_IDs=0 Mem=0 GRES=shard:3(IDX:1)
     Nodes=gpu02 CPU_IDs=0-1 Mem=0 GRES=gpu:a100:2(IDX:0-1)
   TresPerNode=gres:shard:3
"""


def test_each_node_reads_its_own_gres() -> None:
    assert job_gres(SHOW, "gpu01") == ("shard", 3, (1,))
    assert job_gres(SHOW, "gpu02") == ("gpu", 2, (0, 1))
    assert job_gres(SHOW, "gpu03") is None


def test_a_job_without_gpu_gres_has_none() -> None:
    text = "JobId=3\n     Nodes=gpu01 CPU_IDs=0 Mem=0 GRES=\n"
    assert job_gres(text, "gpu01") is None
    single = "     Nodes=gpupool0 CPU_IDs=0 Mem=0 GRES=shard:2(IDX:0)\n"
    assert job_gres(single, "") == ("shard", 2, (0,))
