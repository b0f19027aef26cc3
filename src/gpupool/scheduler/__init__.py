"""Placement engine: cluster state, feasibility, policies, priorities."""
