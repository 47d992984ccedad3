"""The runtime's CPU platform: stock vLLM's CpuPlatform with the config-time patches applied.

Registered in the `vllm.platform_plugins` group; an out-of-tree platform plugin takes priority
over the built-in CPU platform. With EDGE_HARNESS_PATCHES=none it declines, and vLLM is stock.
"""

from __future__ import annotations

from runtime import norms, patches

QUALNAME = "runtime.platform.EdgeCpuPlatform"
CONFIG_PATCHES = ("kv-budget-from-geometry", "explicit-kv-wins", "cpu-norm-kernels")


def activate() -> str | None:
    """vLLM calls this to ask whether this platform applies."""
    try:
        chosen = patches.selected()
    except ValueError:
        return None
    if not any(n in chosen for n in CONFIG_PATCHES):
        return None
    from vllm.platforms import cpu_platform_plugin
    return QUALNAME if cpu_platform_plugin() else None


def _make_class():
    from vllm.platforms.cpu import CpuPlatform

    class EdgeCpuPlatform(CpuPlatform):
        @classmethod
        def check_and_update_config(cls, vllm_config) -> None:
            explicit = vllm_config.cache_config.kv_cache_memory_bytes
            super().check_and_update_config(vllm_config)
            if patches.should_apply("explicit-kv-wins"):
                patches.APPLIED["explicit-kv-wins"] = patches.apply_explicit_kv_wins(vllm_config, explicit)
            if patches.should_apply("kv-budget-from-geometry"):
                patches.APPLIED["kv-budget-from-geometry"] = patches.apply_kv_budget(vllm_config)

        @classmethod
        def get_default_ir_op_priority(cls, vllm_config):
            prio = super().get_default_ir_op_priority(vllm_config)
            registered = patches.APPLIED.get("cpu-norm-kernels")  # by the general plugin, in this process
            if registered is not None and "declined" not in registered:
                registered["priority"] = norms.priority(prio)
            return prio

    EdgeCpuPlatform.__qualname__ = "EdgeCpuPlatform"
    EdgeCpuPlatform.__module__ = __name__
    return EdgeCpuPlatform


def __getattr__(name: str):
    # vLLM imports this module only when the platform is active: build the subclass lazily then
    if name == "EdgeCpuPlatform":
        cls = _make_class()
        globals()["EdgeCpuPlatform"] = cls
        return cls
    raise AttributeError(name)
