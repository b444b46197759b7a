"""Kubernetes operator for mirrorq: pure planning and builders, thin kopf handlers."""
