"""The kubelet's pod-resources API, v1 (api.proto, generated as published)."""
