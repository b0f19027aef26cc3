"""Kubernetes: device plugin, scheduler extender, webhook, the API client seam."""
