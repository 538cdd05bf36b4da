"""hcsctl: the operator's command line for hcsd."""
