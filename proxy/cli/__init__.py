"""The `sandgate` command: `main` parses and dispatches; one module per command group."""
