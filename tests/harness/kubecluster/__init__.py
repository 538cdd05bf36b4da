"""A two-node Kubernetes cluster with real kubelets, HCS deployed on it, for tests of HCS as
users run it (docs/testing.md).

- `cluster`: the control plane, kube-controller-manager, the extender, the nodes; start/close;
- `node`: one node (mount namespace, containerd, hcsd, hcs-syncer, kubelet, cgroup root);
- `namespace`: the node's private mount namespace;
- `vendors`: the simulated NVIDIA and Ascend nodes (node file, device nodes, driver files);
- `hcs`: every setting and flag of hcsd, hcs-syncer and the extender, in one place;
- `pods`: the demo pod's spec and pod helpers; `leftovers`: what a deleted pod left on a node;
- `fixture`: the session fixture `kubelet_cluster` (registered in tests/conftest.py).
"""
