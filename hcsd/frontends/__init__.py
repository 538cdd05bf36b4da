"""Entry points for runtimes without NRI: the runc wrapper and the OCI hook."""
