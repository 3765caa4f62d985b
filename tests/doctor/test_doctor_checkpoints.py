"""The run doctor verifies a run folder's checkpoints: a step-NNNNNN folder whose files no longer
match their SHA-256 in its manifest is an error naming the checkpoint, the files and the newest
intact checkpoint; a checkpoint saved without a manifest (an older run) is a note at most. Fake
checkpoints (bytes and a manifest) keep these fast."""

from __future__ import annotations

import json

from test_diagnosis import FACTS, healthy

from rlhf_helpers.doctor import checkpoints as doctor_checkpoints
from rlhf_helpers.doctor import diagnose, format_findings
from rlhf_helpers.ppo.checkpoint_digest import required_files, write_manifest
from rlhf_helpers.stages.diagnose import main

POLICY = "adapters/policy/adapter_model.safetensors"


def run_folder(tmp_path, steps=(1, 2)):
    """A run folder: a healthy metrics.jsonl and one fake checkpoint per step, each with its
    manifest."""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in healthy(3)))
    for step in steps:
        folder = tmp_path / f"step-{step:06d}"
        for name in required_files():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(bytes(range(256)) * 40)  # 10 KiB, no zero run of 4 KiB
        write_manifest(folder)
    return tmp_path


def zero_4_kib(path):
    data = bytearray(path.read_bytes())
    data[1024:5120] = bytes(4096)
    path.write_bytes(bytes(data))


def test_a_checkpoint_with_4_kib_of_its_adapter_zeroed_is_an_error_naming_it(tmp_path, capsys):
    run = run_folder(tmp_path)
    zero_4_kib(run / "step-000002" / POLICY)
    diagnosis = diagnose(run, facts=FACTS)
    found = {f.rule: f for f in diagnosis.findings}["damaged_checkpoint"]
    assert found.severity == "error" and found.steps == (2,)
    assert str(run / "step-000002" / POLICY) in found.evidence and "SHA-256" in found.evidence
    assert "newest intact checkpoint: step-000001" in found.evidence
    assert main([str(run)]) == 0  # as for every other error finding: the run was read
    assert "[error] damaged_checkpoint" in capsys.readouterr().out


def test_intact_checkpoints_give_no_finding_and_a_metrics_file_reads_its_folder_s(tmp_path):
    run = run_folder(tmp_path)
    assert not diagnose(run, facts=FACTS).findings
    zero_4_kib(run / "step-000001" / "heads.safetensors")
    found = {f.rule: f
             for f in diagnose(run / "metrics.jsonl", facts=FACTS).findings}["damaged_checkpoint"]
    assert found.steps == (1,) and "newest intact checkpoint: step-000002" in found.evidence


def test_every_checkpoint_damaged_says_none_is_intact(tmp_path):
    run = run_folder(tmp_path)
    (run / "step-000001" / "heads.safetensors").unlink()
    (run / "step-000002" / "manifest.json").write_text("{")
    found = {f.rule: f for f in diagnose(run, facts=FACTS).findings}["damaged_checkpoint"]
    assert found.steps == (1, 2) and "no intact checkpoint" in found.evidence
    assert ("heads.safetensors is missing" in found.evidence
            and "manifest.json is unreadable" in found.evidence)


def test_a_checkpoint_without_a_manifest_is_a_note_not_an_error(tmp_path, monkeypatch):
    run = run_folder(tmp_path, steps=(1,))
    (run / "step-000001" / "manifest.json").unlink()
    # its files read back well
    monkeypatch.setattr(doctor_checkpoints, "verify_checkpoint", lambda folder: [])
    diagnosis = diagnose(run, facts=FACTS)
    assert not diagnosis.findings
    assert "step-000001 was saved without a manifest" in format_findings(diagnosis)


def test_a_checkpoint_a_killed_save_left_aside_is_a_note_and_stays_where_it_is(tmp_path):
    run = run_folder(tmp_path)
    aside = run / ".old-step-000002-999999999"  # a PID no process has
    (run / "step-000002").rename(aside)
    (run / ".old-step-000001-999999999").mkdir()  # an older copy: step-000001 is in place
    diagnosis = diagnose(run, facts=FACTS)
    assert not diagnosis.findings
    shown = format_findings(diagnosis)
    assert "step-000002 is at .old-step-000002-999999999" in shown
    assert "step-000001 is at" not in shown
    assert aside.is_dir() and not (run / "step-000002").exists()  # the doctor moves nothing


class HashedBytes:
    """hashlib.sha256 counting the bytes fed to it: how much of what file was read."""

    def __init__(self, monkeypatch):
        import hashlib

        self.total, real, spy = 0, hashlib.sha256, self

        class Counting:
            def __init__(self, data=b""):
                self.inner = real(data)
                spy.total += len(data)

            def update(self, data):
                spy.total += len(data)
                self.inner.update(data)

            def hexdigest(self):
                return self.inner.hexdigest()

        monkeypatch.setattr(hashlib, "sha256", Counting)


BIG = 256 << 20  # a sparse file: 256 MiB of zeros that take no disk


def test_a_manifest_listing_a_link_to_a_big_file_is_refused_unread(tmp_path, monkeypatch):
    """Before: an edited manifest listing a link made the doctor (and a resume) hash whatever the
    link pointed to, a 20 GB file as well."""
    (tmp_path / "run").mkdir()
    run = run_folder(tmp_path / "run")
    big = tmp_path / "elsewhere" / "big.bin"
    big.parent.mkdir()
    with open(big, "wb") as handle:
        handle.truncate(BIG)
    folder = run / "step-000002"
    (folder / "extra.bin").symlink_to(big)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["extra.bin"] = {"sha256": "0" * 64, "bytes": BIG}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    hashed = HashedBytes(monkeypatch)
    found = {f.rule: f for f in diagnose(run, facts=FACTS).findings}["damaged_checkpoint"]
    assert found.steps == (2,)
    assert f"{folder / 'extra.bin'} is a link (to {big})" in found.evidence, found.evidence
    assert hashed.total < 1 << 20  # the checkpoints' own files only, never the big one


def test_a_listed_file_of_another_size_is_damaged_without_being_read(tmp_path, monkeypatch):
    run = run_folder(tmp_path)
    with open(run / "step-000002" / POLICY, "r+b") as handle:
        handle.truncate(BIG)  # grown to 256 MiB after the save
    hashed = HashedBytes(monkeypatch)
    found = {f.rule: f for f in diagnose(run, facts=FACTS).findings}["damaged_checkpoint"]
    assert f"({BIG} bytes, 10240 when saved)" in found.evidence, found.evidence
    assert hashed.total < 1 << 20
