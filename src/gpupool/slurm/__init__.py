"""Slurm: a node's job steps held to their shards by gpupool; a dev cluster for tests."""
