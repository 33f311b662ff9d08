"""The LeaderWorkerSet controller's manifest is applied only as pinned content
(``infra.stack.kube.controller``): its bytes checked against their sha256 before anything is
kept or applied, the controller's image by digest, no other image by tag; fetched once and kept
by its sha256, fetched again when what is kept is not those bytes. No network: the fetch is the
test's."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.core import pins
from infra.stack.kube import controller
from tests.pulumi_mocks import CONTROLLER_MANIFEST

# The program's own download (collected before the session's fixture answers for it).
DOWNLOAD = controller.download
TEXT = CONTROLLER_MANIFEST.read_bytes()
SHA = hashlib.sha256(TEXT).hexdigest()
IMAGE = f"{pins.LWS_IMAGE}@sha256:" + "7" * 64
PINNED = controller.ControllerRelease(pins.LWS_MANIFEST_URL, SHA, pins.LWS_IMAGE_BY_TAG, IMAGE)


def images(objects: list[dict[str, Any]]) -> list[str]:
    return [
        container["image"]
        for obj in objects
        if obj["kind"] == "Deployment"
        for container in obj["spec"]["template"]["spec"]["containers"]
    ]


def test_the_controller_runs_by_digest_and_nothing_else_changes() -> None:
    objects = controller.pinned_objects(TEXT, PINNED)
    assert images(objects) == [IMAGE]
    original = [o for o in yaml.safe_load_all(TEXT) if o]
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        (o["kind"], o["metadata"]["name"]) for o in original
    ]


def test_bytes_of_another_sha256_are_refused_naming_both() -> None:
    changed = TEXT.replace(b"replicas: 2", b"replicas: 3")
    with pytest.raises(controller.ControllerError) as error:
        controller.pinned_objects(changed, PINNED)
    assert error.value.setting == "kubernetesControllerSha256"
    assert hashlib.sha256(changed).hexdigest() in str(error.value) and SHA in str(error.value)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        # Another image by tag (a sidecar the manifest gained): no setting pins it.
        (
            lambda t: t.replace(
                b"        - name: manager\n",
                b"        - name: proxy\n          image: quay.io/brancz/kube-rbac-proxy:v0.18.0\n"
                b"        - name: manager\n",
            ),
            "'quay.io/brancz/kube-rbac-proxy:v0.18.0' by tag",
        ),
        # The controller moved: not the release the program knows.
        (lambda t: t.replace(b"namespace: lws-system", b"namespace: kube-system"), "no Deployment"),
        (lambda t: t.replace(b"lws/lws:v0.10.0", b"lws/lws:v0.11.0"), "by tag"),
    ],
)
def test_a_manifest_unlike_the_release_is_refused(edit: object, words: str) -> None:
    text = edit(TEXT)  # type: ignore[operator]
    pinned = controller.ControllerRelease(
        PINNED.url, hashlib.sha256(text).hexdigest(), PINNED.image_by_tag, IMAGE
    )
    with pytest.raises(controller.ControllerError, match="nothing was created") as error:
        controller.pinned_objects(text, pinned)
    assert words in str(error.value)


def test_an_image_by_digest_in_the_manifest_is_kept() -> None:
    other = "quay.io/brancz/kube-rbac-proxy@sha256:" + "1" * 64
    text = TEXT.replace(
        b"        - name: manager\n",
        f"        - name: proxy\n          image: {other}\n".encode()
        + b"        - name: manager\n",
    )
    pinned = controller.ControllerRelease(
        PINNED.url, hashlib.sha256(text).hexdigest(), PINNED.image_by_tag, IMAGE
    )
    assert images(controller.pinned_objects(text, pinned)) == [other, IMAGE]


def test_the_manifest_is_fetched_once_kept_by_sha256_and_fetched_again_if_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controller, "manifests_dir", lambda: tmp_path)
    fetched: list[str] = []

    def fetch(url: str) -> bytes:
        fetched.append(url)
        return TEXT

    first = controller.verified_manifest(PINNED, fetch=fetch)
    again = controller.verified_manifest(PINNED, fetch=fetch)
    assert first == again and fetched == [pins.LWS_MANIFEST_URL]
    assert (tmp_path / f"{SHA}.yaml").read_bytes() == TEXT
    assert images(list(yaml.safe_load_all(first.read_text()))) == [IMAGE]
    # What is kept is not trusted for its name: other bytes there are fetched again.
    (tmp_path / f"{SHA}.yaml").write_bytes(TEXT + b"# edited\n")
    controller.verified_manifest(PINNED, fetch=fetch)
    assert len(fetched) == 2 and (tmp_path / f"{SHA}.yaml").read_bytes() == TEXT


def test_bytes_that_fail_the_check_are_never_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controller, "manifests_dir", lambda: tmp_path)
    with pytest.raises(controller.ControllerError, match="has sha256"):
        controller.verified_manifest(PINNED, fetch=lambda _url: TEXT + b"\n")
    assert list(tmp_path.iterdir()) == []


def test_without_pins_or_settings_the_release_is_refused_naming_each_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pins, "LWS_MANIFEST_SHA256", None)
    monkeypatch.setattr(pins, "LWS_IMAGE_BY_DIGEST", None)
    with pytest.raises(controller.ControllerError) as error:
        controller.release(None, IMAGE)
    assert error.value.setting == "kubernetesControllerSha256"
    assert f"curl -sL {pins.LWS_MANIFEST_URL} | sha256sum" in str(error.value)
    with pytest.raises(controller.ControllerError) as error:
        controller.release(SHA, None)
    assert error.value.setting == "kubernetesControllerImage"
    assert f"imagetools inspect {pins.LWS_IMAGE_BY_TAG}" in str(error.value)
    assert controller.release(SHA, IMAGE) == PINNED


def test_recorded_pins_need_no_settings_and_a_different_sha256_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pins, "LWS_MANIFEST_SHA256", SHA)
    monkeypatch.setattr(pins, "LWS_IMAGE_BY_DIGEST", IMAGE)
    assert controller.release(None, None) == PINNED
    # A mirror of the image is the operator's to choose; the manifest's bytes are not.
    mirror = "123456789012.dkr.ecr.us-east-1.amazonaws.com/lws@sha256:" + "8" * 64
    assert controller.release(None, mirror).image == mirror
    with pytest.raises(controller.ControllerError, match="remove the setting"):
        controller.release("0" * 64, None)


def test_only_https_is_fetched() -> None:
    with pytest.raises(controller.ControllerError, match="not an https URL"):
        DOWNLOAD("http://github.com/kubernetes-sigs/lws/manifests.yaml")
