"""The Dockerfile and ``make image``'s recipe (``healer_dev/image.py``) describe one image: the
same Debian release and packages, user, venv, environment, port, files, entrypoint and command
(ADR 0011). The chart's default image, the plain manifests' and the README's are the one
``make image`` names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from healer_dev import image

ROOT = Path(__file__).resolve().parents[2]


def _final_stage() -> list[str]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("FROM ")]
    return lines[starts[-1]:]


def _instr(stage: list[str], name: str) -> list[str]:
    return [ln[len(name) + 1:].strip() for ln in stage if ln.startswith(name + " ")]


def test_the_dockerfile_builds_from_the_recipes_debian_release() -> None:
    (base,) = _instr(_final_stage(), "FROM")
    assert base == f"debian:{image.SUITE}-slim"


def test_the_dockerfile_installs_exactly_the_recipes_packages() -> None:
    runs = " ".join(_instr(_final_stage(), "RUN"))
    m = re.search(r"apt-get install -y --no-install-recommends ([^&]+)", runs)
    assert m, runs
    assert tuple(m.group(1).split()) == image.PACKAGES


def test_the_dockerfile_has_the_recipes_user_venv_and_entrypoint() -> None:
    stage = _final_stage()
    runs = " ".join(_instr(stage, "RUN"))
    assert f"python3 -m venv --without-pip {image.VENV}" in runs
    assert "--no-index --no-compile" in runs
    passwd = f"{image.USER}:x:{image.UID}:{image.UID}:healer:/nonexistent:/usr/sbin/nologin"
    assert passwd in runs
    assert _instr(stage, "USER") == [f"{image.UID}:{image.UID}"]
    assert [json.loads(e) for e in _instr(stage, "ENTRYPOINT")] == [list(image.ENTRYPOINT)]
    assert [json.loads(c) for c in _instr(stage, "CMD")] == [list(image.CMD)]
    assert _instr(stage, "EXPOSE") == [str(image.EXPOSE)]
    env = dict(e.split("=", 1) for e in _instr(stage, "ENV"))
    assert env == image.ENV
    copies = {tuple(c.split()) for c in _instr(stage, "COPY") if not c.startswith("--from")}
    assert copies == set(image.FILES.items())


def test_the_charts_default_image_is_the_one_make_image_builds() -> None:
    values = yaml.safe_load((ROOT / "deploy/helm/healer/values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "deploy/helm/healer/Chart.yaml").read_text())
    assert values["image"]["repository"] == image.REPOSITORY
    assert (values["image"]["tag"] or chart["appVersion"]) == image.version()
    for manifest in ("deploy/deployment.yaml", "deploy/agent/daemonset.yaml"):
        images = re.findall(r"image: (\S+)", (ROOT / manifest).read_text())
        assert images == [f"{image.REPOSITORY}:{image.version()}"], (manifest, images)
    readme = (ROOT / "README.md").read_text()
    assert "make image" in readme
    assert f"{image.REPOSITORY}:{image.version()}" in readme
