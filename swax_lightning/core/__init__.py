"""The floor every layer stands on: atomic file writes, the run environment's record, the error types a command
reports in one line, and the reader of YAML files with `extends:`. Imports nothing of the framework and no Lightning."""
