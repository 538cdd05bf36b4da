"""`python -m hcsd.cluster.extender_cli`: the extender without the installed entry point."""

from hcsd.cluster.commands import extender_main

raise SystemExit(extender_main())
