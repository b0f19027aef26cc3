"""gpupool: share and pool NVIDIA GPUs."""

__version__ = "0.1.0"
