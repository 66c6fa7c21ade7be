"""The `eaglespec` command line: one module per subcommand."""
