"""The front ends a container runtime starts as processes of their own: the runc wrapper
(`hcs-runtime`), the OCI hook (`hcs-oci-hook`) and the pre-launched NRI relay
(`hcs-nri-plugin`). Each talks to hcsd; none holds state. The NRI plugin itself and the API
are front ends inside hcsd (hcsd/runtime/nri/, hcsd/api/)."""
