"""kubelet's plugin APIs as generated code (proto/hcsd/cluster/kubeletplugin/wire; make proto)."""
