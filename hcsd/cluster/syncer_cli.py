"""`python -m hcsd.cluster.syncer_cli`: hcs-syncer without the installed entry point."""

from hcsd.cluster.commands import syncer_main

raise SystemExit(syncer_main())
