"""The verification caches of `harness check` and `harness report` (harness/hashcache.py StoreCache): the same
results with and without them, for good, truncated, edited and planted artifacts; files unchanged since are not
read again; a corrupt cache is ignored; the cache lives outside the store and is never written through a link.
And store.too_deep, the nesting guard rewritten for speed, against the byte-by-byte scan it replaced."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

from harness import check, hashcache, report, store

@pytest.fixture
def env(cached_store):
    """A store of published artifacts of every kind (fidelity with their references), a cache folder of its own,
    caching from the first file (tests/conftest.py)."""
    return cached_store


def _uncached(root: Path, monkeypatch) -> tuple[int, list[str]]:
    with monkeypatch.context() as m:
        m.setattr(check, "CACHE_FROM", 10**9)
        return check.check([str(root)], verify_models=False)


def _counting(monkeypatch) -> list[str]:
    """The files check reads from here on."""
    calls: list[str] = []
    real = check._check_file
    monkeypatch.setattr(check, "_check_file", lambda f, allow, *shared: calls.append(str(f)) or real(f, allow, *shared))
    return calls


def _damage(root: Path) -> dict[str, Path]:
    files = sorted(root.rglob("*.json"))
    run = next(p for p in files if p.parent.name == "quickstart")
    fid = next(p for p in files if p.parent.name == "fidelity")
    truncated, edited, planted = files[3], run, root / "quickstart" / ("0" * 64 + ".json")
    truncated.write_bytes(truncated.read_bytes()[:500])
    doc = json.loads(edited.read_text())
    doc["workload"]["gen_len"] += 1  # edited after it was written: the id no longer matches
    edited.write_text(json.dumps(doc, indent=1))
    doc["id"] = "0" * 64  # planted: a copy under another name
    planted.write_text(json.dumps(doc))
    (root / "quickstart" / "dup.json").write_bytes(fid.read_bytes())  # a duplicate id
    return {"truncated": truncated, "edited": edited, "planted": planted}


def test_check_is_the_same_with_and_without_the_cache(env, monkeypatch):
    _damage(env)
    want = _uncached(env, monkeypatch)
    assert want[0] > 60 and len(want[1]) >= 5
    calls = _counting(monkeypatch)
    cold = check.check([str(env)], verify_models=False)
    n_cold = len(calls)
    warm = check.check([str(env)], verify_models=False)
    assert cold == want and warm == want
    assert n_cold == want[0] and len(calls) == n_cold  # warm: not one file read again
    cache_files = list((env.parent / "cache" / "verified").iterdir())
    assert len(cache_files) == 1 and not any(p.name.endswith(".cache") for p in env.rglob("*"))


def test_an_edit_is_seen_however_it_keeps_size_and_mtime(env, monkeypatch):
    check.check([str(env)], verify_models=False)
    victim = sorted((env / "quickstart").glob("*.json"))[0]
    st = os.stat(victim)
    raw = bytearray(victim.read_bytes())
    i = raw.index(b'"gen_len": ') + len(b'"gen_len": ')
    raw[i:i + 1] = b"9" if raw[i:i + 1] != b"9" else b"8"  # same size, in place (same inode)
    with open(victim, "r+b") as f:
        f.write(raw)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back; ctime cannot be
    assert os.stat(victim).st_ino == st.st_ino and os.stat(victim).st_size == st.st_size
    calls = _counting(monkeypatch)
    got = check.check([str(env)], verify_models=False)
    assert calls == [str(victim)]
    assert got == _uncached(env, monkeypatch) and any(p.startswith(f"{victim}: id:") for p in got[1])


def test_a_corrupt_or_foreign_cache_is_ignored(env, monkeypatch):
    damaged = _damage(env)
    want = _uncached(env, monkeypatch)
    check.check([str(env)], verify_models=False)
    (path,) = (env.parent / "cache" / "verified").iterdir()
    good = path.read_bytes()
    head, body = good.split(b"\n", 1)
    entries = json.loads(body)
    rel = str(damaged["edited"].relative_to(env))
    entries[rel][1][0] = []  # "no problems" for the edited artifact, the sha256 in the head left as it was
    forged = head + b"\n" + json.dumps(entries).encode()
    for bad in (good[: len(good) // 2], b"garbage", forged, b"\n" + body):
        path.write_bytes(bad)
        with monkeypatch.context() as m:
            calls = _counting(m)
            assert check.check([str(env)], verify_models=False) == want
            assert len(calls) == want[0]  # all checked again


def test_the_cache_is_replaced_never_written_through_a_link(env, monkeypatch):
    check.check([str(env)], verify_models=False)
    (path,) = (env.parent / "cache" / "verified").iterdir()
    victim = env.parent / "victim"
    victim.write_text("keep")
    path.unlink()
    path.symlink_to(victim)
    assert check.check([str(env)], verify_models=False) == _uncached(env, monkeypatch)
    assert victim.read_text() == "keep" and not path.is_symlink()


def test_files_changed_just_before_they_were_read_are_not_cached(env, monkeypatch):
    monkeypatch.setattr(hashcache, "RACY_NS", 10**18)  # every file "just changed"
    check.check([str(env)], verify_models=False)
    calls = _counting(monkeypatch)
    check.check([str(env)], verify_models=False)
    assert len(calls) > 60


def test_report_is_the_same_with_and_without_the_cache(env, monkeypatch):
    _damage(env)
    with monkeypatch.context() as m:
        m.setattr(check, "CACHE_FROM", 10**9)
        want = report.build_all([str(env)])[2]["left_out"], report.render([str(env)])
    loads: list[Path] = []
    real = report.inputs.load_path
    monkeypatch.setattr(report.inputs, "load_path", lambda p, **kw: loads.append(p) or real(p, **kw))
    cold = report.build_all([str(env)])[2]["left_out"], report.render([str(env)])
    n_cold = len(loads)
    warm = report.build_all([str(env)])[2]["left_out"], report.render([str(env)])
    assert cold == want and warm == want and len(want[0]) >= 3
    assert n_cold > 50 and len(loads) == n_cold  # warm: nothing hashed or checked again


def _old_too_deep(raw: bytes, limit: int) -> bool:
    depth = 0
    in_str = esc = False
    for c in raw:
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif c in (0x5D, 0x7D):
            depth -= 1
    return False


def test_too_deep_is_the_byte_scan_it_replaced():
    rng = random.Random(7)
    for _ in range(50_000):
        raw = bytes(rng.choice(b'[]{}"\\ax') for _ in range(rng.randint(0, 30)))
        limit = rng.randint(0, 5)
        assert store.too_deep(raw, limit) == _old_too_deep(raw, limit), (raw, limit)
    assert store.too_deep(b"[" * 65) and not store.too_deep(b"[" * 64 + b"]" * 64)
    assert not store.too_deep(b'["' + b"[" * 100 + b'"]')  # inside a string
    assert not store.too_deep(b'["\\"' + b"[" * 100)  # an escaped quote: still inside
    assert store.too_deep(b'["\\\\"' + b"[" * 100)  # an escaped backslash, then the closing quote


def test_the_caches_of_stores_gone_are_removed(env, tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    shutil.copytree(env / "quickstart", gone / "quickstart")
    check.check([str(gone)], verify_models=False)
    path = hashcache.store_cache_path("check", gone, check.cache_options(False))
    assert path.is_file()
    shutil.rmtree(gone)
    check.check([str(env)], verify_models=False)  # writes its own cache, and prunes
    assert not path.exists() and hashcache.store_cache_path("check", env, check.cache_options(False)).is_file()
