"""The command line: ``lrc`` (``infra.cli.lrc``) and what every command shares."""
