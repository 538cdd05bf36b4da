"""The fleet's arrays (`hcsd.cluster.fleet`): what they cannot hold is decided node by node and
never breaks a snapshot; their copies, widths and tables stay bounded."""

from __future__ import annotations

import pytest

from hcsd.cluster.objects import ObjectError, node_view
from tests.unit.fleet import node_object


def test_a_compute_node_with_an_absurd_vram_is_refused() -> None:
    obj = node_object("n1")
    obj["spec"]["devices"][0]["vramBytes"] = 2**47
    with pytest.raises(ObjectError, match="vramBytes"):
        node_view(obj)
