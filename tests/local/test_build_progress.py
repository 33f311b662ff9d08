"""The local cluster's llama.cpp build says how far it is while it runs (minutes on two cores),
with the build script's own lines as they come; a stand-in script plays the build here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infra.local import cluster
from infra.local.cluster import LocalClusterError, UpOptions, build_progress

BUILD = """#!/usr/bin/env bash
log() { printf '%s build-llama.sh: %s\\n' 2026-11-28T00:00:00Z "$*" >&2; }
root="$LLAMA_PREFIX/$LLAMA_CPP_COMMIT"
mkdir -p "$root"
log "fetching llama.cpp $LLAMA_CPP_COMMIT from $LLAMA_CPP_SOURCE"
log "building llama-server ggml-rpc-server with 2 jobs"
for step in 1 150 300; do
  echo "[$step/300] Building CXX object ggml/src/step-$step.cpp.o" >> "$root/build.log"
  sleep 0.3
done
if [[ "$LLAMA_CPP_COMMIT" == bad ]]; then log "llama.cpp build failed: see build.log"; exit 1; fi
log "built llama-server ggml-rpc-server into $root/bin"
"""


@pytest.fixture
def options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> UpOptions:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "build-llama.sh").write_text(BUILD)
    monkeypatch.setattr(cluster, "SCRIPTS_DIR", scripts)
    monkeypatch.setattr(cluster, "BUILD_REPORT_SECONDS", 0.1)
    monkeypatch.setattr(cluster, "build_prefix", lambda cache: tmp_path / "prefix")
    return UpOptions(workers=2, model=tmp_path / "m.gguf", source=tmp_path / "src",
                     cache=tmp_path / "cache", commit="c0ffee")  # fmt: skip


def test_ninja_steps_read_as_progress() -> None:
    assert build_progress("") == ""
    assert build_progress("[1/590] a\n[412/590] b\nFAILED: x\n") == "412 of 590 steps (69%)"


def test_the_build_reports_its_steps_and_its_scripts_lines(
    options: UpOptions, tmp_path: Path
) -> None:
    said: list[str] = []
    cluster.build_on_host(options, tmp_path, said.append)
    assert said[0] == "llama.cpp build on this machine (skipped when it is there)"
    assert said[1:3] == [
        f"llama.cpp: fetching llama.cpp c0ffee from {tmp_path / 'src'}",
        "llama.cpp: building llama-server ggml-rpc-server with 2 jobs",
    ]
    steps = [line for line in said if line.startswith("llama.cpp build: ")]
    assert steps and all(" of 300 steps (" in line and "min so far" in line for line in steps)
    assert said[-1].startswith("llama.cpp: built llama-server ggml-rpc-server into ")


def test_a_failed_build_says_the_scripts_own_words(options: UpOptions, tmp_path: Path) -> None:
    with pytest.raises(LocalClusterError, match=r"llama\.cpp build failed: see build\.log"):
        cluster.build_on_host(dataclasses.replace(options, commit="bad"), tmp_path, None)
