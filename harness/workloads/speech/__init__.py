"""Speech: text in, an audio stream out (docs/speech.md). A speech grid names a committed text set per cell
(`workload.text` or `axes.text`: short, long), its model is a voice (harness/voices.py) and its arms speech engines
(engines declaring harness.engines.capabilities.Speaks); each repetition sends one request, one text chosen by the
seed the arms of a pass share, and the engine stamps each audio chunk as it arrives.

    texts.py     the committed texts and the seeded choice
    playback.py  the metrics, computed from each chunk's arrival and audio duration (the playback model)
"""

from __future__ import annotations

from typing import Any

from harness.grid.spec import err, short
from harness.workloads.base import WorkloadKind
from harness.workloads.speech import texts
from harness.workloads.speech.playback import SERVED_METRICS, SPEECH_METRICS

KIND = "speech"
# what a grid's engines stream in: sentence, a chunk per sentence (Piper's own unit); engine, pieces as the engine
# streams them (an outside server's own unit); each arm's engine declares the ones it does (Speaks.chunking)
CHUNKING = ("sentence", "engine")
TEXT_FIX = f"one of {', '.join(texts.names())} (harness/workloads/speech/texts.py)"
NOT_HERE = ("prompt_len", "gen_len", "context_len")  # token lengths: a speech request is a text


def is_speech(fixed: dict[str, Any], axes: dict[str, list]) -> bool:
    return "text" in fixed or "text" in axes


class Speech(WorkloadKind):
    name = KIND
    metrics = {**SPEECH_METRICS, **SERVED_METRICS}

    def parse(self, path: str, workload: dict[str, Any], axes: dict[str, list]) -> tuple[dict[str, Any], dict]:
        text, chunking = workload.pop("text", None), workload.pop("chunking", None)
        if text is None and "text" not in axes:
            if chunking is not None:
                raise err(path, "workload.chunking", "applies to a speech grid", "add workload.text (docs/speech.md)")
            return {}, {}
        if text is not None and "text" in axes:
            raise err(path, "workload.text", "is also an axis", "give it once: workload.text or axes.text")
        if text is not None:
            self.axis_value(path, "workload.text", "text", text, False)
        chunking = "sentence" if chunking is None else chunking
        if chunking not in CHUNKING:
            raise err(path, "workload.chunking", f"unknown chunking {short(chunking)}",
                      f"one of {', '.join(CHUNKING)} (docs/speech.md)")
        return {"chunking": chunking}, ({"text": text} if text is not None else {})

    def axis_value(self, path: str, fld: str, axis: str, v: Any, rule: bool) -> bool:
        if axis != "text":
            return False
        if not isinstance(v, str) or v not in texts.TEXTS:
            raise err(path, fld, f"unknown text set {short(v)}", TEXT_FIX)
        return True

    def owns(self, fixed: dict[str, Any], axes: dict[str, list]) -> bool:
        return is_speech(fixed, axes)

    def require(self, path: str, fixed: dict[str, Any], axes: dict[str, list]) -> None:
        if not is_speech(fixed, axes):
            return
        for k in NOT_HERE:
            if k in fixed or k in axes:
                raise err(path, f"{'axes' if k in axes else 'workload'}.{k}", "is a token length; a speech request "
                          "is a text", "drop it (workload.text names the texts)")
        if fixed.get("batch", 1) != 1 or "batch" in axes:
            raise err(path, "workload.batch", "a speech engine here streams one request at a time", "drop it")

    def validate(self, spec: Any) -> None:
        from harness.engines import engine_class
        from harness.engines.capabilities import Speaks
        from harness import voices
        speech = bool(self.fields(spec))
        if speech and (spec.kinds.get("serving") or {}).get("slo") is not None:  # the serving kind's field
            raise err(spec.path, "workload.slo", "bounds token latencies; served speech's goodput is its stall-free "
                      "streams (stall_free_streams_s)", "drop workload.slo (docs/speech.md)")
        load = (spec.kinds.get("serving") or {}).get("load") or {}
        token_load = [name for key, name in (("shared_prefix", "shared_prefix"), ("turns", "conversations"),
                                             ("trace", "trace"), ("dataset", "dataset")) if key in load]
        if speech and token_load:
            raise err(spec.path, f"workload.load.{token_load[0]}", "shapes token prompts; a speech request is a text",
                      "drop it (docs/speech.md)")
        if speech:
            needs = any(engine_class(a.engine).needs_model for a in spec.arms)
            sets = spec.axes.get("text") or [spec.fixed.get("text")]
            for m in spec.axes.get("model") or [spec.model]:
                fld = "axes.model" if "model" in spec.axes else "model"
                if not voices.known(m) and (needs or m != "none"):
                    raise err(spec.path, fld, f"{short(m)} is not a voice: a speech grid speaks a voice, not a "
                              "language model", f"known voices: {', '.join(voices.VOICES)}")
                if voices.known(m):  # each arm's forms are the voice's, and its engine reads the voice's format
                    for a in spec.arms:
                        eng = engine_class(a.engine)
                        if not issubclass(eng, Speaks):
                            continue
                        voices.refuse_reader(f"{spec.path}: arms[{a.name}].engine", m, a.engine, eng.formats)
                        for f in [a.form] if a.form else (spec.axes.get("form") or [eng.default_form]):
                            voices.check_form(f"{spec.path}: arms[{a.name}].form", f, m)
                lang = voices.VOICES[m].language if voices.known(m) else None
                for t in sets:
                    if lang and t in texts.LANGUAGE and texts.LANGUAGE[t] != lang:
                        raise err(spec.path, fld, f"voice {m} speaks {lang}; the text set {t} is "
                                  f"{texts.LANGUAGE[t]}", f"use a {lang} text set: "
                                  f"{', '.join(k for k, v in texts.LANGUAGE.items() if v == lang)}")
        for a in spec.arms:
            speaks = issubclass(engine_class(a.engine), Speaks)
            if speech and not speaks:
                raise err(spec.path, f"arms[{a.name}].engine", f"{a.engine} does not speak: a speech grid's arms are "
                          "speech engines", f"use {', '.join(speech_engines())}")
            if speaks and not speech:
                raise err(spec.path, "workload.text", f"arm {a.name!r} runs the speech engine {a.engine}, which needs "
                          "texts", f"set workload.text ({TEXT_FIX})")
            chunking = self.fields(spec).get("chunking", "sentence")
            can = engine_class(a.engine).chunking_for(a.options) if speaks else ()
            if speech and speaks and chunking not in can:
                raise err(spec.path, "workload.chunking", f"{chunking}: arm {a.name!r}'s engine {a.engine} streams "
                          f"{' or '.join(can)}{' as its options ask' if can != engine_class(a.engine).chunking else ''}",
                          f"workload.chunking: {can[0]} (docs/speech.md)")

    def record(self, spec: Any, params: dict[str, Any], resolved: dict | None) -> dict[str, Any]:
        if "text" not in params:
            return {}
        name = params["text"]
        return {"speech": {"text_set": name, "texts_sha256": texts.set_sha256(name), "n_texts": len(texts.TEXTS[name]),
                           "chunking": self.fields(spec).get("chunking", "sentence")}}


def speech_engines() -> list[str]:
    from harness.engines import ENGINES, engine_class
    from harness.engines.capabilities import Speaks
    return [n for n in ENGINES if issubclass(engine_class(n), Speaks)]
