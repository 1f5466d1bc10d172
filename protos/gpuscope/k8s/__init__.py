"""Kubernetes wire schemas gpuscope speaks, as Kubernetes publishes them."""
