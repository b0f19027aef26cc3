"""Simulated GPUs: a node spec, its directory and state, the backend over it, the MPS twin."""
