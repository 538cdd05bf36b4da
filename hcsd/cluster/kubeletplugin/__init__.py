"""HCS's kubelet DRA plugin (driver compute.hcs.io), served from hcs-syncer: registration,
NodePrepareResources/NodeUnprepareResources, with hcsd holding the claims (docs/dra.md)."""
