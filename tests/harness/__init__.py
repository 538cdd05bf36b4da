"""What the test suites share to run HCS for real, each written once.

- `daemon`: hcsd as a process (config file from settings, sd_notify, hcsctl against it);
- `local`: a node's state in one process (a NodeService over a real ledger, an injector);
- `bundles`: OCI bundles on Debian's busybox, and hcs-runtime run on them;
- `waiting`: polling for a condition with a deadline and a message that says what was awaited;
- `umasks`: what other tasks see of the process umask while a socket is bound;
- `peers`: the real peers (containerd, crictl, runc; kube-apiserver, kube-scheduler, etcd;
  kubelet, kube-controller-manager, kubectl), built from their Go modules once and cached
  under ~/.cache/hcs/peers;
- `kubecluster`: a two-node cluster with real kubelets and HCS on it (`kubelet_cluster`).

Suites keep what only they need (their node files, their runtime or control-plane fixtures)
next to their tests; the benchmarks import from here too.
"""
