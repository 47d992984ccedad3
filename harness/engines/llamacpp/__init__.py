"""The llama.cpp engine package: everything the harness knows of llama.cpp.

- engine.py: the `llama.cpp` engine (requests served by native/edge-bench.cpp; fidelity by edge-fidelity.cpp),
  with its hardware rules (bf16 form from AVX2 up, context padding, memory admission, the ISA cap read back);
- llama_bench.py: the `llama-bench` engine (llama.cpp's own benchmark, its own metric definitions);
- build.py: provisioning: the pinned sdist built with CMake, cached outside the checkout by content, ISA
  variants for emulation, the project's native tools linked against it (and the model zoo's GGUF converters).

Importing this package imports nothing else: the model zoo uses build.py without loading the engines.
"""
