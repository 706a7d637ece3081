"""Every supervised stage on the tiny model, chained as a user would run them, then `rlft eval`.

    rlft train algo=sft run.name=chain ...    (3 steps)
    rlft train algo=rm  run.name=chain ...    (reads runs/chain/sft/final)
    rlft train algo=prm run.name=chain ...    (reads runs/chain/sft/final)
    rlft eval run.name=chain ...

How "the trained model" is observed: each stage runs through `rlft.cli.main` inside a small
driver (helpers.PROBE_DRIVER) that wraps two functions without changing what they compute:
the stage's `load_model` (to snapshot the parameters training starts from) and
`rlft.stages.common.finish` (to record, just before the Hugging Face export, the live
DeepSpeed-wrapped model's parameters and its logits on two fixed texts). Single-rank training
runs inside the driver process, so these are the real training objects. The test then loads
final/ with plain `transformers` Auto classes and checks that (a) the exported weights equal the
live ones bit for bit, (b) the reloaded model gives the same logits (atol 1e-6), (c) the tokenizer
reloaded with AutoTokenizer encodes like the training one, and (d) every parameter tensor moved
away from where training started (for RM/PRM the start is SFT's final backbone plus a new head,
which is also checked, so the backbone must differ from SFT's output).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from helpers import (SMALL_BATCH, TINY, assert_finite, check_ok, load_safetensors, read_manifest, run_cli, run_probed,
                     stage_dir, tmp_leftovers, train_records)

RUN = "chain"
STEPS = 3
COMMON = [f"run.name={RUN}", *TINY, *SMALL_BATCH, f"train.max_steps={STEPS}"]
HEADS = {"sft": "AutoModelForCausalLM", "rm": "AutoModelForSequenceClassification",
         "prm": "AutoModelForTokenClassification"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stages")


@pytest.fixture(scope="module")
def trained(workdir) -> dict:
    """Run the three stages once (SFT first); {algo: (probe record, CompletedProcess)}."""
    out = {}
    for algo in ("sft", "rm", "prm"):
        probe = workdir / f"probe-{algo}.pt"
        proc = check_ok(run_probed(workdir, probe, "train", f"algo={algo}", *COMMON))
        out[algo] = (torch.load(probe, weights_only=False), proc)
    return out


def _stage(workdir, algo) -> Path:
    return stage_dir(workdir, RUN, algo)


@pytest.mark.parametrize("algo", ["sft", "rm", "prm"])
def test_stage_outputs_and_metrics(trained, workdir, algo):
    run = _stage(workdir, algo)
    for name in ("config.yaml", "metrics.jsonl", "manifest.json", "final/config.json", "final/model.safetensors",
                 "final/tokenizer.json"):
        assert (run / name).is_file(), name
    records = train_records(run)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert_finite(r["loss"] for r in records)
    assert_finite(r["lr"] for r in records)
    first = records[0]["loss"]
    if algo == "sft":  # an untrained model over the 100-token char vocabulary: ~ln(100) nats per token
        assert abs(first - math.log(100)) < 0.15, first
    else:  # a near-zero scalar head: Bradley-Terry / BCE start near ln 2
        assert abs(first - math.log(2)) < 0.2, first
    evals = train_records(run, key="eval_loss")
    assert len(evals) == 1 and evals[0]["step"] == STEPS and math.isfinite(evals[0]["eval_loss"])
    manifest = read_manifest(run)
    assert manifest["completed"] is True
    assert manifest["stage"] == algo and manifest["run_name"] == RUN
    if algo == "sft":
        assert manifest["parent"] == "builtin:tiny"
    else:
        assert (workdir / manifest["parent"]).resolve() == (_stage(workdir, "sft") / "final").resolve()
    assert math.isfinite(manifest["summary"]["loss"])
    assert not tmp_leftovers(run)
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())


@pytest.mark.parametrize("algo", ["sft", "rm", "prm"])
def test_every_parameter_changed(trained, algo):
    record, _ = trained[algo]
    initial, final = record["initial"], record["final"]
    assert set(initial) == set(final) and len(initial) >= 10
    unchanged = [name for name in initial if torch.equal(initial[name], final[name])]
    assert not unchanged, f"{algo}: parameters that did not change in {STEPS} steps: {unchanged}"


@pytest.mark.parametrize("algo", ["rm", "prm"])
def test_reward_models_start_from_the_sft_backbone(trained, workdir, algo):
    sft_final = load_safetensors(_stage(workdir, "sft") / "final")
    record, _ = trained[algo]
    backbone = {name: t for name, t in record["initial"].items() if name.startswith("model.")}
    assert backbone and set(backbone) == {n for n in sft_final if n.startswith("model.")}
    for name, tensor in backbone.items():
        assert torch.equal(tensor, sft_final[name]), name
    assert any(name.startswith("score.") for name in record["initial"])
    # ...and training moved the backbone away from SFT's output
    trained_weights = load_safetensors(_stage(workdir, algo) / "final")
    assert all(not torch.equal(trained_weights[n], sft_final[n]) for n in backbone)


@pytest.mark.parametrize("algo", ["sft", "rm", "prm"])
def test_final_reloads_with_plain_transformers(trained, workdir, algo):
    import transformers

    record, _ = trained[algo]
    final_dir = _stage(workdir, algo) / "final"
    saved = load_safetensors(final_dir)
    assert set(saved) == set(record["final"])
    for name, tensor in record["final"].items():
        assert torch.equal(saved[name], tensor), name

    model = getattr(transformers, HEADS[algo]).from_pretrained(final_dir)
    model.eval()
    assert type(model).__name__.startswith("Llama")
    tokenizer = transformers.AutoTokenizer.from_pretrained(final_dir)
    assert tokenizer.pad_token_id is not None and tokenizer.eos_token_id is not None
    with torch.no_grad():
        for text, ids, expected in zip(record["texts"], record["input_ids"], record["logits"]):
            reloaded_ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            assert torch.equal(reloaded_ids, ids)
            logits = model(input_ids=reloaded_ids).logits.float()
            assert logits.shape == expected.shape
            torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
    if algo == "sft":
        assert record["logits"][0].shape[-1] == len(tokenizer) == 100
    else:
        assert model.config.num_labels == 1


def test_eval_writes_metrics(trained, workdir):
    proc = check_ok(run_cli(workdir, "eval", f"run.name={RUN}", *TINY, "eval.num_problems=5", "eval.samples=2",
                            "eval.k=[1,2]", "eval.max_new_tokens=16", "eval.batch_size=16"))
    out = workdir / "runs" / RUN / "eval" / "sft"
    record = json.loads((out / "eval.json").read_text())
    m = record["metrics"]
    assert m["num_problems"] == 5
    for key in ("greedy_accuracy", "pass@1", "pass@2", "maj@1", "maj@2"):
        assert 0.0 <= m[key] <= 1.0, (key, m[key])
    assert m["pass@1"] <= m["pass@2"]
    assert 0 < m["mean_response_tokens"] <= 16
    assert 0.0 <= m["truncation_rate"] <= 1.0
    assert record["settings"]["k"] == [1, 2] and record["settings"]["samples"] == 2
    assert (workdir / record["resolved_path"]).resolve() == (_stage(workdir, "sft") / "final").resolve()
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 5 and all(len(s["samples"]) == 2 for s in samples)
    assert "greedy_accuracy" in proc.stdout


def test_eval_compares_checkpoints_with_reward_rm_score_and_kl(trained, workdir):
    """Two checkpoints in one call: the SFT model against itself (KL exactly 0) and a copy of it with
    noise added to every weight against SFT (KL > 0); per-source rewards, their weighted total, the
    RM score of the run's RM stage, and one comparison table with a row per model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = _stage(workdir, "sft") / "final"
    noisy = AutoModelForCausalLM.from_pretrained(final)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(0.5 * torch.randn_like(p))
    noisy.save_pretrained(workdir / "noisy" / "final")
    AutoTokenizer.from_pretrained(final).save_pretrained(workdir / "noisy" / "final")
    common = [f"run.name={RUN}", *TINY, "eval.num_problems=6", "eval.samples=2", "eval.k=[1,2]",
              "eval.max_new_tokens=16", "eval.batch_size=16", "eval.policy_samples=3",
              "reward.functions=[correctness,format]", "reward.weights=[1.0,0.5]"]
    check_ok(run_cli(workdir, "eval", *common, f"eval.models=[stage:sft,{workdir / 'noisy' / 'final'}]",
                     "eval.reference=stage:sft"))
    root = workdir / "runs" / RUN / "eval"
    sft = json.loads((root / "sft" / "eval.json").read_text())
    base = json.loads((root / "noisy" / "eval.json").read_text())
    for record in (sft, base):
        m = record["metrics"]
        assert m["policy_samples"] == 18
        assert m["reward"] == pytest.approx(m["reward/correctness"] + 0.5 * m["reward/format"], abs=1e-9)
        assert 0.0 <= m["reward/format"] <= 1.0 and math.isfinite(m["rm_score"])
        assert record["rm"] and Path(record["rm"]).parent.name == "rm"
    assert sft["metrics"]["kl_to_ref"] == 0.0  # the model against itself
    assert base["metrics"]["kl_to_ref"] > 1.0  # the noisy copy is far from the SFT model
    assert base["metrics"]["kl_to_ref_per_token"] > 0.0
    table = (root / "comparison.md").read_text()
    assert "| sft |" in table and "| noisy |" in table and "kl_to_ref" in table
    csv_rows = (root / "comparison.csv").read_text().splitlines()
    assert csv_rows[0].startswith("model,") and len(csv_rows) >= 3


def test_eval_auto_reference_is_the_runs_sft_and_none_turns_it_off(trained, workdir):
    common = [f"run.name={RUN}", *TINY, "eval.num_problems=3", "eval.samples=1", "eval.k=[1]",
              "eval.max_new_tokens=8", "eval.policy_samples=2"]
    check_ok(run_cli(workdir, "eval", *common, "model.path=builtin:tiny"))
    record = json.loads((workdir / "runs" / RUN / "eval" / "builtin_tiny" / "eval.json").read_text())
    assert Path(record["reference"]).parent.name == "sft" and "kl_to_ref" in record["metrics"]
    check_ok(run_cli(workdir, "eval", *common, "model.path=stage:sft"))  # auto: not against itself
    record = json.loads((workdir / "runs" / RUN / "eval" / "sft" / "eval.json").read_text())
    assert record["reference"] is None and "kl_to_ref" not in record["metrics"]
    check_ok(run_cli(workdir, "eval", *common, "model.path=builtin:tiny", "eval.reference=none", "eval.rm=none"))
    record = json.loads((workdir / "runs" / RUN / "eval" / "builtin_tiny" / "eval.json").read_text())
    assert "kl_to_ref" not in record["metrics"] and "rm_score" not in record["metrics"]
