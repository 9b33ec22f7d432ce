"""Every benchmark users run again, as `kvstrata bench <command>` (cli.py's table); the repo's bench/ holds results, peer scripts and one-off measurement scripts."""
