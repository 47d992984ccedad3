"""`harness check` refuses artifacts that lie plausibly: each test edits a published run artifact and recomputes
its id (what a liar would do), so the id check passes and only the consistency rules can catch the lie."""

import copy
import json
from pathlib import Path

import pytest

from harness import artifact, check, emulate, grid, rules, schedule
from harness.grid import cell_id
from harness.schedule import run_key
from harness.store import load_path

ROOT = Path(__file__).resolve().parents[1]


def _find(pred, prefer=()):
    """The first published artifact (its path and document) that `pred` accepts, looking in `prefer` first."""
    dirs = [ROOT / "artifacts" / p for p in prefer] + [ROOT / "artifacts"]
    for d in dirs:
        for p in sorted(d.rglob("*.json")) if d.is_dir() else ():
            doc = json.loads(p.read_text())
            if pred(doc):
                return p, doc
    pytest.skip("no published artifact of this shape")


def _ok_run(doc, engine="llama.cpp"):
    return doc.get("kind") == "run" and doc.get("status") == "ok" and doc["engine"]["name"] == engine


@pytest.fixture(scope="module")
def batched():
    """A llama.cpp run at batch > 1 under the shared metric definitions, with settings read back."""
    return _find(lambda d: _ok_run(d) and d["workload"]["batch"] > 1 and d["workload"]["warmups"] > 0
                 and d["execution"]["effective"].get("metric_definitions") and d["execution"].get("settings"),
                 prefer=("batch-sweep",))[1]


@pytest.fixture(scope="module")
def emulated():
    """A llama.cpp run that emulated a hardware class, every cap emulated."""
    return _find(lambda d: _ok_run(d) and d["host"].get("emulation") and d["execution"]["emulation"]["emulated"],
                 prefer=("hardware-ladder", "hardware-memory"))[1]


def _lie(doc, edit, reid=True):
    d = copy.deepcopy(doc)
    edit(d)
    if reid:
        d["id"] = artifact.compute_id(d)
    return d, f"{d['id']}.json"


def _problems(d, where):
    return check.check_doc(d, where, verify_models=False)


def test_the_published_artifacts_used_here_pass(batched, emulated):
    for doc in (batched, emulated):
        assert _problems(doc, f"{doc['id']}.json") == []


def test_settings_row_contradicting_the_read_back_is_refused(batched):
    threads = batched["execution"]["threads"]

    def read_back(d):
        d["execution"]["effective"]["threads"] = threads + 1
    d, w = _lie(batched, read_back)
    assert _problems(d, w) == [f"{w}: execution.settings.threads.effective: {threads}, but the engine's read-back "
                               f"execution.effective.threads is {threads + 1}"]

    def ctx(d):
        d["execution"]["effective"]["n_ctx_per_seq"] *= 2
    d, w = _lie(batched, ctx)
    assert [p for p in _problems(d, w) if "settings.context_len.effective" in p], _problems(d, w)

    def option(d):  # an options.<key> row against the key of the same name
        d["execution"]["settings"]["options.n_batch"] = {"requested": 256, "effective": 256, "rule": "enforced",
                                                         "source": "read by edge-bench"}
    d, w = _lie(batched, option)
    n_batch = batched["execution"]["effective"]["n_batch"]
    assert _problems(d, w) == [f"{w}: execution.settings.options.n_batch.effective: 256, but the engine's read-back "
                               f"execution.effective.n_batch is {n_batch}"]

    def requested(d):  # the request recorded twice, two ways
        d["execution"]["threads"] = 1
        d["execution"]["cpu_affinity"] = d["execution"]["cpu_affinity"][::-1]
    d, w = _lie(batched, requested)
    probs = _problems(d, w)
    assert f"{w}: execution.settings.threads.requested: {threads}, but execution.threads is 1" in probs
    assert any(p.startswith(f"{w}: execution.settings.cpus.requested: ") for p in probs), probs

    def workload(d):
        d["workload"]["warmups"] = 0
    d, w = _lie(batched, workload)
    assert f"{w}: execution.settings.warmups.requested: 1, but workload.warmups is 0" in _problems(d, w)


def test_sample_counts_contradicting_repetitions_are_refused(batched):
    reps, b = batched["workload"]["repetitions"], batched["workload"]["batch"]
    d, w = _lie(batched, lambda d: d["metrics"]["ttft_s"]["samples"].pop())
    assert _problems(d, w) == [f"{w}: metrics.ttft_s.samples: {reps * b - 1} samples, but its definition makes "
                               f"{reps * b} (one per request: workload.repetitions {reps} x batch {b})"]
    d, w = _lie(batched, lambda d: d["metrics"]["output_tok_s"]["warmup_samples"].clear())
    assert _problems(d, w) == [f"{w}: metrics.output_tok_s.warmup_samples: 0 samples, but its definition makes 1 "
                               "(workload.warmups 1)"]

    def fewer(d):  # a run claimed to have measured one repetition more than it did
        d["workload"]["repetitions"] += 1
        d["execution"]["requested"]["repetitions"] += 1
    d, w = _lie(batched, fewer)
    probs = _problems(d, w)
    assert f"{w}: metrics.output_tok_s.samples: {reps} samples, but its definition makes {reps + 1} (one per " \
           f"repetition: workload.repetitions {reps + 1})" in probs
    assert len([p for p in probs if ".samples: " in p]) == len(batched["metrics"])


def test_samples_longer_than_the_run_are_refused(batched):
    dur = batched["timing"]["duration_s"]

    def long(d):
        d["metrics"]["itl_max_s"]["samples"][0] = dur * 1.5
    d, w = _lie(batched, long)
    assert f"{w}: metrics.itl_max_s.samples: {dur * 1.5:.6g} s, longer than the whole run (timing.duration_s " \
           f"{dur:.6g} s)" in _problems(d, w)

    def together(d):  # each request shorter than the run, the repetitions one after another longer
        m = d["metrics"]
        m["e2e_s"]["samples"] = [dur * 0.6] * len(m["e2e_s"]["samples"])
    d, w = _lie(batched, together)
    probs = _problems(d, w)
    assert any(p.startswith(f"{w}: metrics.e2e_s.samples: its repetitions take ") for p in probs), probs

    def rate(d):  # a rate is what its times make under the shared definitions
        d["metrics"]["prefill_tok_s"]["samples"][1] *= 2
    d, w = _lie(batched, rate)
    probs = _problems(d, w)
    assert len(probs) == 1 and probs[0].startswith(f"{w}: metrics.prefill_tok_s.samples[1]: ") \
        and "but prompt_len" in probs[0], probs

    def decode(d):
        d["metrics"]["decode_tok_s"]["warmup_samples"][0] *= 1.1
    d, w = _lie(batched, decode)
    probs = _problems(d, w)
    assert len(probs) == 1 and probs[0].startswith(f"{w}: metrics.decode_tok_s.warmup_samples[0]: "), probs


def test_a_process_faster_than_any_machine_can_start_one_is_refused():
    _, doc = _find(lambda d: _ok_run(d, "command"))

    def instant(d):
        d["metrics"]["wall_s"]["samples"][0] = 1e-9
    d, w = _lie(doc, instant)
    assert any(p.startswith(f"{w}: metrics.wall_s.samples: 1e-09 s for a fresh process") for p in _problems(d, w))
    assert not _problems(*_lie(doc, lambda d: None))


def test_timing_out_of_order_is_refused(batched):
    t = batched["timing"]

    def swap(d):
        d["timing"]["start"], d["timing"]["end"] = t["end"], t["start"]
    d, w = _lie(batched, swap)
    assert _problems(d, w) == [f"{w}: timing.end: {t['start']} is before timing.start {t['end']}"]

    def shorter(d):
        d["timing"]["duration_s"] = round(t["duration_s"] / 2, 6)
    d, w = _lie(batched, shorter)
    assert any(p.startswith(f"{w}: timing.duration_s: {t['duration_s'] / 2:.6g} s, but end - start is ")
               for p in _problems(d, w)), _problems(d, w)

    d, w = _lie(batched, lambda d: d["timing"].update(start="yesterday"))
    assert f"{w}: timing.start: 'yesterday' is not an ISO 8601 timestamp" in _problems(d, w)


def test_cell_params_contradicting_the_cell_id_are_refused(batched):
    def params(d):
        d["grid"]["cell_params"]["batch"] = 1
    d, w = _lie(batched, params)
    probs = _problems(d, w)
    assert any(p.startswith(f"{w}: grid.cell: ") and "is not the id of grid.cell_params" in p for p in probs), probs
    assert f"{w}: workload.batch: {batched['workload']['batch']}, but the cell's batch is 1" in probs

    def consistent_cell(d):  # the cell id and run key recomputed too: the workload still says otherwise
        g = d["grid"]
        g["cell_params"]["prompt_len"] = 64
        g["cell"] = cell_id(g["cell_params"])
        g["run_key"] = run_key(g["cell"], g["arm"], g["pass_index"])
    d, w = _lie(batched, consistent_cell)
    assert _problems(d, w) == [f"{w}: workload.prompt_len: {batched['workload']['prompt_len']}, but the cell's "
                               "prompt_len is 64"]

    def stale_key(d):
        g = d["grid"]
        g["cell_params"]["prompt_len"] = 64
        g["cell"] = cell_id(g["cell_params"])
        d["workload"]["prompt_len"] = 64
    d, w = _lie(batched, stale_key)
    probs = _problems(d, w)
    assert any(p.startswith(f"{w}: grid.run_key: ") for p in probs), probs


def test_threads_beyond_the_affinity_are_refused(batched):
    aff = batched["execution"]["cpu_affinity"]
    n = len(aff) + 1

    def threads(d):  # every record of the thread count agrees; the CPUs it ran on do not hold them
        ex = d["execution"]
        ex["threads"] = ex["requested"]["threads"] = ex["effective"]["threads"] = ex["effective"]["n_threads"] = n
        ex["settings"]["threads"].update(requested=n, effective=n)
    d, w = _lie(batched, threads)
    assert _problems(d, w) == [f"{w}: execution.threads: {n} threads on {len(aff)} CPU(s) {aff}: runs pin one thread "
                               "per CPU"]

    cpus = batched["host"]["cpu"]["online_cpus"]
    far = max(cpus) + 64

    def beyond(d):
        ex = d["execution"]
        new = aff[:-1] + [far]
        ex["cpu_affinity"] = ex["requested"]["cpus"] = ex["effective"]["cpu_affinity"] = new
        ex["settings"]["cpus"].update(requested=new, effective=new)
    d, w = _lie(batched, beyond)
    online = f"host.cpu.online_cpus ({len(cpus)} CPUs)"
    assert _problems(d, w) == [f"{w}: {field}: CPU(s) [{far}] are not on this host ({online})"
                               for field in ("execution.cpu_affinity", "execution.settings.cpus.effective")]


def test_non_finite_or_negative_samples_are_refused(batched):
    for bad in (float("nan"), float("inf"), float("-inf")):
        # no id can be computed over NaN or infinity: the liar cannot make the id match, and the sample is named
        d, w = _lie(batched, lambda d: d["metrics"]["ttft_s"]["samples"].__setitem__(0, bad), reid=False)
        probs = _problems(d, w)
        assert any(": id: content is not canonical JSON" in p for p in probs), probs
        assert f"{w}: metrics.ttft_s.samples[0]: {bad} is not a finite number" in probs, probs

    d, w = _lie(batched, lambda d: d["metrics"]["itl_p50_s"]["warmup_samples"].__setitem__(1, -0.01))
    assert f"{w}: metrics.itl_p50_s.warmup_samples[1]: -0.01 s is negative, which a time cannot be" in _problems(d, w)
    d, w = _lie(batched, lambda d: d["metrics"]["output_tok_s"]["samples"].__setitem__(0, -5.0))
    assert f"{w}: metrics.output_tok_s.samples[0]: -5.0 tok/s is negative, which a rate cannot be" in _problems(d, w)

    # status ok means something was measured
    d, w = _lie(batched, lambda d: d["metrics"].clear())
    assert f"{w}: metrics: empty" in _problems(d, w)
    d, w = _lie(batched, lambda d: d["metrics"]["ttft_s"].update(samples=[], warmup_samples=[]))
    assert f"{w}: metrics.ttft_s.samples: empty (raw samples are required)" in _problems(d, w)


def test_emulation_cap_contradicting_its_evidence_is_refused(emulated):
    caps = emulated["execution"]["emulation"]["caps"]

    def memory(d):
        m = d["execution"]["emulation"]["caps"]["memory"]
        m["effective_available_bytes"] = m["requested_bytes"] * 2
    d, w = _lie(emulated, memory)
    probs = _problems(d, w)
    assert len(probs) == 1 and probs[0].startswith(f"{w}: execution.emulation.caps.memory: status emulated, "
                                                   "but "), probs

    def cores(d):
        c = d["execution"]["emulation"]["caps"]["cores"]
        c["effective"] = list(range(c["requested"] + 1))
    d, w = _lie(emulated, cores)
    probs = _problems(d, w)
    assert len(probs) == 1 and probs[0].startswith(f"{w}: execution.emulation.caps.cores: status emulated, but the "
                                                   "engine ran on "), probs

    def flag(d):
        d["execution"]["emulation"]["caps"]["isa"]["status"] = "not emulated: no switch"
    d, w = _lie(emulated, flag)
    assert _problems(d, w) == [f"{w}: execution.emulation.emulated: True, but cap(s) isa are not"]
    assert caps["cores"]["status"] == "emulated"


def test_problems_of_filters_parsed_artifacts(batched):
    """The report's filter: parsed artifacts (legacy ones migrated) in, the lies out, one line per problem."""
    legacy = _find(lambda d: d.get("schema_version") == 1 and d.get("kind") == "run" and d.get("status") == "ok")[0]
    current = _find(lambda d: d.get("id") == batched["id"], prefer=("batch-sweep",))[0]
    good = [(load_path(p), str(p)) for p in (legacy, current)]
    assert [check.problems_of(a, w) for a, w in good] == [[], []]
    lie, w = _lie(batched, lambda d: d["execution"]["effective"].update(threads=99))
    bad = artifact.parse(lie, w)
    kept, lines = check.accepted([good[0], (bad, w), good[1]])
    assert kept == [good[0][0], good[1][0]]
    assert lines == [f"{w}: execution.settings.threads.effective: {batched['execution']['threads']}, but the engine's "
                     "read-back execution.effective.threads is 99"]


@pytest.mark.parametrize("params", [{}, {"prompt_len": 128, "batch": 2, "form": "gguf-bf16"},
                                    {"hardware": "pi5", "threads": 4, "replicate": 1.5, "eager": True}])
def test_what_check_judges_by_is_the_original(params):
    """check reads the cell id, the run key and the memory tolerance from harness/rules.py, as the grid, the
    schedule and emulation do (one definition each, without their modules' imports in every check)."""
    assert check.cell_id is grid.cell_id is rules.cell_id and check.run_key is schedule.run_key is rules.run_key
    assert check.cell_id(params) == grid.cell_id(params)
    assert check.run_key(grid.cell_id(params), "arm", 3) == schedule.run_key(grid.cell_id(params), "arm", 3)
    assert check.MEMORY_TOLERANCE == emulate.MEMORY_TOLERANCE


def test_a_grid_sha256_its_commits_grid_file_does_not_have_is_refused(batched, tmp_path):
    """grid.sha256 is checked against the grid file in the commit that ran it (git history), where that commit
    tracks it: a lie with the id recomputed is caught; a grid outside the checkout has nothing to say it against."""
    from harness.check.gridfiles import grid_record
    d, w = _lie(batched, lambda d: d["grid"].update(sha256="0" * 64))
    (tmp_path / w).write_text(json.dumps(d))
    n, probs = check.check([str(tmp_path)], verify_models=False)
    assert n == 1 and any(p.startswith(f"{tmp_path / w}: grid.sha256: {'0' * 64}, but {batched['grid']['path']} at "
                                       f"commit {batched['harness']['commit'][:12]}") for p in probs), probs
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / f"{batched['id']}.json").write_text(json.dumps(batched))
    assert check.check([str(ok)], verify_models=False) == (1, [])
    moved, _ = _lie(batched, lambda d: d["grid"].update(path="/elsewhere/g.yaml"))
    assert grid_record(artifact.parse(moved, "x")) is None


def test_a_made_grids_template_is_checked_against_its_commit_too(batched, tmp_path):
    """grid.derived_from (a bisect probe's committed template) is checked as grid.sha256 is: a template whose file
    at the commit hashes otherwise is refused, naming the field; the true hash passes."""
    import hashlib
    import subprocess

    from harness.paths import PROJECT_ROOT
    path, commit = batched["grid"]["path"], batched["harness"]["commit"]
    true = hashlib.sha256(subprocess.run(["git", "-C", str(PROJECT_ROOT), "show", f"{commit}:{path}"], check=True,
                                         capture_output=True).stdout).hexdigest()
    for sha, bad in (("0" * 64, True), (true, False)):
        d, w = _lie(batched, lambda d: d["grid"].update(derived_from={"path": path, "sha256": sha, "by": "test"}))
        folder = tmp_path / sha[:4]
        folder.mkdir()
        (folder / w).write_text(json.dumps(d))
        n, probs = check.check([str(folder)], verify_models=False)
        want = f"{folder / w}: grid.derived_from.sha256: {sha}, but {path} at commit {commit[:12]}"
        assert n == 1 and any(p.startswith(want) for p in probs) == bad, probs
        assert not [p for p in probs if not p.startswith(want) and "id:" not in p], probs


def test_a_host_block_of_another_machine_is_refused_where_the_build_says_otherwise(batched):
    """Another machine's identity, its key recomputed: llama.cpp's system info (read back by the run) names ISA
    features its build used; a host block whose CPU lacks one is not the machine that ran it."""
    from harness.probe import host_key
    used = [f for f in ("avx2", "fma", "f16c") if f" {f.upper()} = 1" in batched["execution"]["effective"]["system_info"]]
    assert used, "the published run's build reports AVX2"

    def other(d):
        d["host"]["cpu"]["isa"][used[0]] = False
        d["host"]["key"] = host_key(d["host"])
    d, w = _lie(batched, other)
    assert f"{w}: host.cpu.isa.{used[0]}: false, but the engine's read-back says its build used it (execution." \
           "effective): the run and the host block are not of one machine" in _problems(d, w)
