"""MIG profile catalog, layout planner, mig-parted config format (pure)."""
