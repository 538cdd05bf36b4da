"""The cluster side: hcs-syncer (hcsd → ComputeNode) and hcs-scheduler-extender.

The only part of HCS that imports `kubernetes`; the daemon never needs cluster credentials.
"""
