"""Default files, directories and sockets: on the node, and inside a container.

The node's defaults are hcsd's configuration defaults and what the packages, the systemd unit
and the DaemonSet's hostPath mounts set up (docs/packaging.md); the container's are what hcsd
mounts and libhcs reads (docs/libhcs.md). A client that takes a path option defaults to these.
"""

from __future__ import annotations

# --- on the node --------------------------------------------------------------------------------
CONFIG_FILE = "/etc/hcsd/hcsd.toml"
KEY_FILE = "/etc/hcsd/assignment.key"  # the single key of earlier releases
SIMULATED_NODE_FILE = "/etc/hcsd/nodes/mixed.toml"
STATE_DIR = "/var/lib/hcsd"  # the ledger
KEYRING_NAME = "keyring.json"  # this node's assignment keys (InstallKeys), in STATE_DIR
RUN_DIR = "/run/hcsd"  # sockets, per-container quota files, the preload file
# hcsd's API (gRPC), root only, in a directory of its own: hcs-syncer's DaemonSet mounts this
# directory alone (read-only), never RUN_DIR with every container's quota files beside it.
API_DIR = f"{RUN_DIR}/api"
SOCKET = f"{API_DIR}/hcsd.sock"
NRI_PRELAUNCH_SOCKET = f"{RUN_DIR}/nri-prelaunch.sock"
LIBHCS = "/usr/lib/hcs/libhcs.so"
BPF_DIR = "/usr/lib/hcs/bpf"
CDI_DIR = "/var/run/cdi"
NRI_SOCKET = "/var/run/nri/nri.sock"  # the container runtime's, not ours
NRI_PLUGIN_DIR = "/opt/nri/plugins"  # where the runtime starts pre-launched plugins
OCI_HOOK_FILE = "/usr/share/containers/oci/hooks.d/hcs.json"  # CRI-O's default hooks_dir

# --- inside a container -------------------------------------------------------------------------
# Two single-file mounts, never a host directory: libhcs reads the quota at this fixed path
# and maps the usage region beside it (libhcs/include/hcs_abi.h).
CONTAINER_DIR = "/run/hcs"
CONTAINER_QUOTA_FILE = f"{CONTAINER_DIR}/quota.conf"  # read-only; HCS_CONFIG points here too
CONTAINER_REGION_FILE = f"{CONTAINER_DIR}/usage.shm"  # read-write, made by hcsd
LIBHCS_IN_CONTAINER = LIBHCS
PRELOAD_FILE = "/etc/ld.so.preload"
