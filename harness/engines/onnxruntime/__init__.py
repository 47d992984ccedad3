"""The ONNX Runtime GenAI engine package (docs/engines.md):

- engine.py: the `onnxruntime-genai` engine (one fresh process of worker.py per run; fidelity by worker.py too);
- forms.py: its model forms (onnx-fp32, onnx-int4, onnx-int4-head), made offline from a prepared model's hf-fp32
  by the pinned package's builder, on demand (the model zoo calls it);
- worker.py: the only file that imports onnxruntime_genai.

Importing this package imports nothing else: the model zoo uses forms.py without loading the engine.
"""
