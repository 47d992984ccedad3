"""The patched vLLM CPU runtime: a vLLM plugin plus the worker that runs one measurement.

Importing this package does no work; vLLM calls `runtime.plugin.register` in each process.
"""
