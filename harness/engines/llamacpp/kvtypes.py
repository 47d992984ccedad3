"""llama.cpp's KV cache types (type_k / type_v, llama-bench's -ctk / -ctv): one table, read by both engines'
options and by the context view's bytes per token (Sizing.kv_bytes_per_value)."""

from __future__ import annotations

from typing import Literal

# bytes per value of each type (block formats: bytes per block / values per block)
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                 "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
KV_TYPES = Literal[tuple(KV_TYPE_BYTES)]  # type: ignore[valid-type]
