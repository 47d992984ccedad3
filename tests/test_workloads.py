"""Workload kinds as a seam (harness/workloads): grid parsing, validation and the report's views dispatch over the
registered kinds, and a new kind is one module plus one registry line."""

from __future__ import annotations

import sys
import textwrap

import pytest

from harness import grid, workloads
from harness.errors import UserError

DOC = {"name": "g", "arms": [{"name": "a", "engine": "command", "options": {"cmd": "true"}}],
       "workload": {"prompt_len": 8, "context_len": 16, "gen_len": 4}, "threads": 1}

KIND = '''
from harness.grid.spec import err
from harness.workloads.base import WorkloadKind


class Echo(WorkloadKind):
    """A kind of its own: `workload.echo` (a word) is its field; it fixes the cell parameter `replicate`."""
    name = "echo"
    metrics = {"echo_s": ("s", False, "the time to say it back")}

    def parse(self, path, workload, axes):
        word = workload.pop("echo", None)
        if word is None:
            return {}, {}
        if not isinstance(word, str) or not word.isalpha():
            raise err(path, "workload.echo", f"must be a word, got {word!r}")
        return {"word": word}, {"replicate": len(word)}

    def record(self, spec, params, resolved):
        return {"echo": self.fields(spec).get("word")}

    def views(self, sec, series):
        return {"echo": sec.get("name")}
'''


@pytest.fixture
def echo_kind(tmp_path, monkeypatch):
    (tmp_path / "echo_kind.py").write_text(textwrap.dedent(KIND))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(workloads.KINDS, "echo", "echo_kind:Echo")  # the one registry line
    workloads.kinds.cache_clear()
    yield
    workloads.kinds.cache_clear()
    sys.modules.pop("echo_kind", None)


def _spec(workload):
    return grid.from_dict({**DOC, "workload": {**DOC["workload"], **workload}}, "g.yaml", "0" * 64)


def test_the_registered_kinds_own_their_fields():
    assert [k.name for k in workloads.kinds()] == list(workloads.KINDS) == ["generation", "serving", "speech"]
    with pytest.raises(UserError, match="workload.prompt_len: is required and has no default"):  # generation's rule
        grid.from_dict({**DOC, "workload": {"context_len": 16, "gen_len": 4}}, "g.yaml", "0" * 64)
    with pytest.raises(UserError, match="workload.load: names neither concurrency nor rate"):  # serving's field
        _spec({"load": {"requests": 4}})
    with pytest.raises(UserError, match=r"workload.echo: unknown field"):  # no kind takes it
        _spec({"echo": "hello"})
    with pytest.raises(UserError, match=r"workload.text: .*a speech request is a text|workload.prompt_len: is a token"):
        _spec({"text": "short"})  # speech's: its cells are texts, the token lengths are refused


@pytest.mark.usefixtures("echo_kind")
def test_a_new_kind_is_one_module_and_one_registry_line():
    spec = _spec({"echo": "hello"})
    (cell,) = grid.expand(spec)
    assert cell.params["replicate"] == 5
    # its fields are its own on the spec, and what it adds to a run's workload block is its record
    assert spec.kinds["echo"] == {"word": "hello"} and workloads.workload_record(spec, cell.params) == {"echo": "hello"}
    with pytest.raises(UserError, match="workload.echo: must be a word"):
        _spec({"echo": "no way"})
    assert workloads.metric_definitions()["echo_s"][0] == "s"
    assert workloads.kind_class("echo")().views({"name": "g"}, []) == {"echo": "g"}
    assert [k.name for k in workloads.kinds()][-1] == "echo"  # what grid and report dispatch over


def test_one_metric_name_one_definition(monkeypatch):
    defs = workloads.metric_definitions()
    assert {"ttft_s", "decode_tok_s"} <= set(defs)
    gen = workloads.kind_class("generation")
    monkeypatch.setattr(gen, "metrics", {**gen.metrics, next(iter(workloads.kind_class("serving").metrics)): ("x", True, "y")})
    with pytest.raises(RuntimeError, match="defined twice, differently"):
        workloads.metric_definitions()
