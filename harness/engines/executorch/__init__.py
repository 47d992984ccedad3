"""The ExecuTorch engine package (docs/engines.md):

- engine.py: the `executorch` engine (one fresh process of worker.py per run, under the environment's python;
  fidelity by worker.py too);
- forms.py: its model forms (pte-fp32, pte-8da4w, pte-8da4w-head), exported offline from a prepared model's
  hf-fp32 to XNNPACK .pte programs by the pinned ExecuTorch, in an environment of its own, on demand (the model zoo
  calls it);
- worker.py: the only file that imports executorch (it runs in that environment, never in the project's venv).

Importing this package imports nothing else: the model zoo uses forms.py without loading the engine.
"""
