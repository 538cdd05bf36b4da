"""The contracts between HCS's parts, each written down once.

Below both the node side (`hcsd.runtime`, `hcsd.daemon`, `hcsd.health`) and the cluster side
(`hcsd.cluster`), so that neither needs the other to agree on a name or a format:

- `names`: annotations, extended resources, the CRD group/version/kinds and the Kubernetes
  object names the manifests use;
- `paths`: default files, directories and sockets on a node and inside a container;
- `assignment`: the signed `hcs.io/assignment` annotation (build, sign, parse, verify);
- `keys`: the assignment key file, one set of checks for every reader, and its installation;
- `quota_file`: the `quota.conf` hcsd writes and libhcs (libhcs/src/config.c) reads;
- `kmsg_needles`: the kernel-line prefilter shared by Python and bpf/kmsg.bpf.c
  (bpf/kmsg_needles.h is generated from it).

Each has a test that holds both sides to it (tests/contract/).
"""
