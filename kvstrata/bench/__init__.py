"""Every benchmark, as `kvstrata bench <command>` (cli.py's table); the repo's bench/ holds only results and peer scripts."""
