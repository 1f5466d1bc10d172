"""The kubelet's pod-resources API (see v1/api.proto)."""
