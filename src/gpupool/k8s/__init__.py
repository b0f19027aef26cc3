"""Kubernetes: device plugin (kubelet gRPC), scheduler extender (HTTP), webhook, API seam."""
