"""Benchmarks: gateway overhead, trace replay, and the fake SGLang worker they (and the tests) share."""
