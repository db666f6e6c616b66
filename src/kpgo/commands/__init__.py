"""One module per subcommand; each exposes register(subparsers)."""
