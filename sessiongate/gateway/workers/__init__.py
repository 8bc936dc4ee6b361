"""Calling and watching the workers: the upstream client and its HTTP/1 pool, the worker extension's client, the
pool of workers with their health, and their load reports."""
