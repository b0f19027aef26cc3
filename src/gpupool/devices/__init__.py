"""GPU inventory and control: NVML backend, simulated backend, MIG apply."""
