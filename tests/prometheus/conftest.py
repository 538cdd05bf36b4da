"""The real control plane with hcsd on each simulated node (tests/cluster's fixture), for a
real Prometheus to scrape."""

from tests.cluster.conftest import cluster

__all__ = ["cluster"]
