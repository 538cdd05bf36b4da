"""The real peers HCS is tested against, built from their Go modules once and cached:
`runtimes` (containerd, its shim, ctr, crictl; Debian's runc) and `kubernetes`
(kube-apiserver, kube-scheduler; kubelet, kube-controller-manager, kubectl; Debian's etcd)
and `helm` (the chart's tests), all through `building`.

`python -m tests.harness.peers` builds them ahead of a test run (a cold build takes minutes;
the tests build what they need themselves, under the same lock).
"""
