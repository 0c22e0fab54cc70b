"""PIN wire contracts."""
