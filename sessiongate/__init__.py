"""The `sessiongate` command line: one entry point composing the gateway, the store and the worker launcher."""
