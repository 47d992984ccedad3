"""edge-harness: reproducible benchmarks with provenance for LLM inference on CPUs.

Importing this package does no work: no hardware probing, no engine imports.
"""

__version__ = "0.1.0"
