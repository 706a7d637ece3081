"""The GRPO update does not depend on micro-batch size, gradient accumulation or world size.

A fixed rollout (char-tokenizer prompts and completions, fixed scores with non-zero group std,
one all-equal group, some truncated completions) goes through the real code: the config is
composed with Hydra and validated (train.batch_size derived), Experience.prepare computes the
reference log-probs (a perturbed copy of the model, so the k3 KL term has a gradient with
kl_coef=0.04), old log-probs when the batch is reused, and registry advantages; then
rlft.stages.update.update_policy steps a Trainer (DeepSpeed). Each configuration runs in a worker
started with `torch.distributed.run` (gloo, CPU); rank r takes its share of every minibatch's
prompts (experience.minibatch_shard) with their G samples, as the RL loop does, and rank 0 saves engine.full_state_dict().

Power: the updates are large (> 1e-4 from the initial weights), and a deliberately broken
normalisation (each micro-batch aggregated with its own counts) is shown to differ. Updates
with plain SGD (the AdamW of rlft.trainer swapped for SGD inside the worker) make the weight
change proportional to the gradient, so even a global rescaling of the loss shows; AdamW's
first step is nearly scale-free, which is why the AdamW cases alone would be weak.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import GLOO_ABORT, REPO, cli_env, free_port

TOL = 1e-5
AGGS = ["seq-mean-token-mean", "token-mean", "constant-norm"]

WORKER = r'''
import copy, json, os, sys
from pathlib import Path

import torch

out_dir, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
world = int(os.environ["WORLD_SIZE"])

from hydra import compose, initialize_config_dir
from rlft import microbatch
from rlft.config.schema import register_schemas
from rlft.config.validate import validate
from rlft.overrides import conf_dir
from rlft.data.tokenizer import build_char_tokenizer
from rlft import dist
from rlft.trainer import Trainer
from rlft.models import load_model
from rlft.rollout import batch as rb
from rlft.stages import experience, update
from rlft.stages.common import Sums

P, G = 4, 4
PROMPTS = ["Q: 1+2?\nA:\n", "Q: 12-5+3?\nA:\n", "Q: 7*3?\nA:\n", "Q: 40-1-2-3?\nA:\n"]
COMPLETIONS = [  # <e> = EOS; lines without it hit max_new_tokens (truncated)
    "1+2=3\n#### 3<e>", "#### 4<e>", "1+2=12\n####", "3<e>",
    "12-5=7\n7+3=10<e>", "#### 10<e>", "12-5=6\n", "#<e>",
    "7*3=21\n#### 21<e>", "21<e>", "#### 2<e>", "7*3=24\n#",
    "40-1=39\n39-2=37<e>", "#### 34<e>", "34<e>", "40-1=3",
]
SCORES = [1.0, 0.0, 0.0, 0.25,  0.5, 1.0, 0.0, 0.0,  1.0, 0.2, 0.0, 0.7,  0.0, 0.0, 0.0, 0.0]
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
        "data.task.num_train=200", "data.task.num_test=20", "train.max_seq_len=128",
        "deepspeed.threads_per_rank=1", "logger.wandb=disabled", "logger.progress=false"]

register_schemas()


def make_cfg(case):
    overrides = ["algo=grpo", *TINY, "deepspeed.device=cpu", "deepspeed.backend=gloo",
                 f"deepspeed.zero_stage={case['zero']}", f"deepspeed.nproc_per_node={world}",
                 f"rollout.prompts_per_step={P}", f"rollout.samples_per_prompt={G}", "rollout.max_new_tokens=16",
                 "algo.kl_coef=0.04", f"algo.loss_agg={case['agg']}", f"train.micro_batch_per_device={case['micro']}",
                 f"algo.updates_per_rollout={case.get('mu', 1)}",
                 f"algo.minibatches_per_rollout={case.get('minibatches', 1)}",
                 f"train.lr={case['lr']}", f"train.grad_clip={case.get('clip', 1.0)}", "train.warmup_steps=0",
                 f"train.max_tokens_per_micro_batch={case.get('tokens', 0)}",
                 f"train.packing={str(case.get('packing', False)).lower()}",
                 f"train.share_prompt={str(case.get('share', False)).lower()}"]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    validate(cfg)
    return cfg


class SGD(torch.optim.SGD):
    """Stands in for AdamW: the weight change is -lr x gradient."""
    def __init__(self, params, lr, **unused):
        super().__init__(params, lr=lr)


class LocalCounts:
    """A broken AGGREGATIONS: every micro-batch normalised by its own counts."""
    def __init__(self, registry):
        self.registry = registry

    def get(self, name):
        fn = self.registry.get(name)
        return lambda loss, mask, denom: fn(loss, mask, None)


tok = build_char_tokenizer()
prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def completion_ids(text):
    eos = text.endswith("<e>")
    ids = tok(text[:-3] if eos else text, add_special_tokens=False)["input_ids"]
    return ids + [tok.eos_token_id] if eos else ids


def rank_rollout(rank, minibatches):
    mine = experience.minibatch_shard(list(range(len(PROMPTS))), minibatches, rank, world)
    rows = [p * G + j for p in mine for j in range(G)]
    prompts = [prompt_ids[i // G] for i in rows]
    comps = [completion_ids(COMPLETIONS[i]) for i in rows]
    ids, attn, mask = rb.build_sequences(prompts, comps, tok.pad_token_id)
    return rb.Rollout(rows=[{"prompt": PROMPTS[i // G]} for i in rows], prompt_texts=[PROMPTS[i // G] for i in rows],
                      completions=[COMPLETIONS[i] for i in rows], completion_ids=comps, input_ids=ids,
                      attention_mask=attn, mask=mask, truncated=torch.tensor([not c.endswith("<e>") for c in
                                                                            [COMPLETIONS[i] for i in rows]]),
                      prompt_lens=[len(p) for p in prompts], scores=torch.tensor([SCORES[i] for i in rows],
                                                                                   dtype=torch.float64))


results = {}
for case in cases:
    cfg = make_cfg(case)
    info = dist.init(cfg.deepspeed)
    saved_adamw, saved_agg = torch.optim.AdamW, update.AGGREGATIONS
    if case.get("optimizer") == "sgd":
        torch.optim.AdamW = SGD
    if case.get("broken"):
        update.AGGREGATIONS = LocalCounts(saved_agg)
    try:
        model = load_model(cfg.model, "builtin:tiny", tok, seed=0)
        ref_model = copy.deepcopy(model)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in ref_model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        policy = Trainer(cfg, model)
        ref = Trainer(cfg, ref_model, trainable=False)
        ro = rank_rollout(info.rank, cfg.algo.minibatches_per_rollout)
        experience.Experience(cfg, info, tok, policy, reference=ref).prepare(ro, cfg.algo.kl_coef)
        assert ro.get("ref_logp") is not None
        reuse = case.get("mu", 1) > 1 or case.get("minibatches", 1) > 1
        assert (ro.get("old_logp") is not None) == reuse
        stats = Sums()
        t = cfg.train
        update.update_policy(policy, ro, stats, update.Shape.of(cfg), cfg.algo.kl_coef)
        # forwards this rank's rows would need alone by the token budget (before the ranks agree)
        items = [[int(n)] for n in ro.attention_mask.sum(-1)]
        alone = len(microbatch.by_tokens(items, t.max_tokens_per_micro_batch,
                                         t.packing)) if t.max_tokens_per_micro_batch else 0
        alone = dist.all_gather_object(alone)
        denom = update.global_denominator(ro.mask, cfg.rollout.max_new_tokens)
        metrics = stats.reduce()
        state = policy.full_state_dict()
        steps = policy.global_step
    finally:
        torch.optim.AdamW, update.AGGREGATIONS = saved_adamw, saved_agg
    if info.is_main:
        torch.save({"initial": initial, "final": state}, out_dir / f"{case['name']}.pt")
        results[case["name"]] = {"metrics": metrics, "steps": steps, "batch_size": cfg.train.batch_size,
                                 "denom": [denom.num_seqs, denom.num_tokens, denom.max_len],
                                 "rows_on_rank0": len(ro), "forwards_alone_per_rank": alone}
    dist.barrier()
if info.is_main:
    (out_dir / "results.json").write_text(json.dumps(results))
dist.shutdown()
'''


def case(name, agg="seq-mean-token-mean", micro=8, zero=0, optimizer="adam", **kw):
    lr = 1e-3 if optimizer == "adam" else 1.0
    return {"name": name, "agg": agg, "micro": micro, "zero": zero, "optimizer": optimizer, "lr": lr,
            "clip": 1.0 if optimizer == "adam" else 0.0, **kw}


ONE_RANK = (
    [case(f"{opt}-{agg}-m{m}", agg, m, optimizer=opt) for opt in ("adam", "sgd") for agg in AGGS for m in (8, 2)]
    + [case(f"broken-{agg}-m{m}", agg, m, optimizer="sgd", broken=True) for agg in AGGS for m in (16, 2)]
    + [case("adam-zero2-m4", micro=4, zero=2),
       case("reuse-m8", "token-mean", 8, mu=2, minibatches=2),
       case("reuse-m2", "token-mean", 2, mu=2, minibatches=2),
       case("mu2-m8", micro=8, mu=2),
       case("sgd-mb2-m8", "token-mean", 8, optimizer="sgd", minibatches=2),
       # forwards cut by a token budget (train.max_tokens_per_micro_batch), padded and packed
       case("sgd-token-mean-tok70", "token-mean", 8, optimizer="sgd", tokens=70),
       case("sgd-token-mean-tok50-packed", "token-mean", 8, optimizer="sgd", tokens=50, packing=True),
       case("reuse-tok60", "token-mean", 8, mu=2, minibatches=2, tokens=60),
       # each group's prompt run once (train.share_prompt); m2 and the token budget split groups
       case("sgd-token-mean-m8-shared", "token-mean", 8, optimizer="sgd", share=True),
       case("sgd-token-mean-tok70-shared", "token-mean", 8, optimizer="sgd", tokens=70, share=True),
       case("reuse-m2-shared", "token-mean", 2, mu=2, minibatches=2, share=True)]
)
TWO_RANKS = [
    case("adam-seq-mean-token-mean-z0-m4", micro=4, zero=0),
    case("adam-seq-mean-token-mean-z2-m4", micro=4, zero=2),
    case("adam-seq-mean-token-mean-z2-m2", micro=2, zero=2),
    case("sgd-token-mean-z0-m4", "token-mean", 4, optimizer="sgd"),
    case("sgd-constant-norm-z2-m2", "constant-norm", 2, zero=2, optimizer="sgd"),
    case("sgd-seq-mean-token-mean-z2-m4", micro=4, zero=2, optimizer="sgd"),
    case("broken-token-mean-z0-m8", "token-mean", 8, optimizer="sgd", broken=True),
    case("mu2-m4", micro=4, mu=2),
    case("sgd-mb2-m4", "token-mean", 4, optimizer="sgd", minibatches=2),
    # ZeRO-3 gathers parameters at every forward: ranks whose rows need different numbers of forwards
    # by the budget must still run the same number
    case("sgd-token-mean-z3-tok45-packed", "token-mean", 4, zero=3, optimizer="sgd", tokens=45, packing=True),
    case("sgd-token-mean-z3-m4-shared", "token-mean", 4, zero=3, optimizer="sgd", share=True),
]


def run_worker(tmp_path, nproc: int, cases: list[dict]) -> dict:
    out = tmp_path / f"w{nproc}"
    out.mkdir()
    (tmp_path / "worker.py").write_text(WORKER)
    spec = out / "cases.json"
    spec.write_text(json.dumps(cases))
    for attempt in (1, 2):
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
               f"--master_port={free_port()}", str(tmp_path / "worker.py"), str(out), str(spec)]
        proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(PYTHONPATH=str(REPO)), capture_output=True,
                              text=True, timeout=400)
        # only the rare abort inside the CPU communication library (helpers.GLOO_ABORT) is
        # retried, once, and reported; anything else fails
        if proc.returncode == 0 or GLOO_ABORT not in proc.stderr or attempt == 2:
            break
        print(f"worker: a rank aborted in the communication library; retrying once\n{proc.stderr[-2000:]}")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    results = json.loads((out / "results.json").read_text())
    states = {c["name"]: torch.load(out / f"{c['name']}.pt") for c in cases}
    return {"results": results, "states": states}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rl_invariance")
    return {1: run_worker(tmp, 1, ONE_RANK), 2: run_worker(tmp, 2, TWO_RANKS)}


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def final(runs, world, name):
    return runs[world]["states"][name]["final"]


def moved(runs, world, name) -> float:
    s = runs[world]["states"][name]
    return max_diff(s["initial"], s["final"])


def test_the_update_is_large_and_the_config_is_derived(runs):
    res = runs[1]["results"]
    for c in ONE_RANK:
        assert moved(runs, 1, c["name"]) > 1e-4, c["name"]  # "no update" cannot pass
        m = res[c["name"]]["metrics"]
        assert m["kl"] > 1e-4, (c["name"], m)  # the perturbed reference makes the KL term active
    assert res["adam-token-mean-m8"]["batch_size"] == 16
    assert res["reuse-m8"]["batch_size"] == 8
    assert res["adam-token-mean-m8"]["steps"] == 1
    assert res["reuse-m2"]["steps"] == 4  # mu=2 passes x 2 minibatches
    assert res["mu2-m8"]["steps"] == 2
    for c in TWO_RANKS:
        assert moved(runs, 2, c["name"]) > 1e-4, c["name"]


@pytest.mark.parametrize("opt", ["adam", "sgd"])
@pytest.mark.parametrize("agg", AGGS)
def test_micro_batch_and_accumulation_do_not_change_the_update(runs, opt, agg):
    a, b = final(runs, 1, f"{opt}-{agg}-m8"), final(runs, 1, f"{opt}-{agg}-m2")
    assert max_diff(a, b) < TOL


@pytest.mark.parametrize("agg", AGGS)
def test_micro_batch_local_normalisation_would_be_caught(runs, agg):
    whole, broken = final(runs, 1, f"broken-{agg}-m16"), final(runs, 1, f"broken-{agg}-m2")
    good = final(runs, 1, f"sgd-{agg}-m8")
    if agg != "constant-norm":  # (its local default L is the padded width, not max_new_tokens)
        assert max_diff(whole, good) < TOL  # one micro-batch = the whole batch: local counts are global
    assert max_diff(broken, good) > 1e-3


def test_reused_batches_with_old_logprobs_do_not_depend_on_micro_batch(runs):
    assert max_diff(final(runs, 1, "reuse-m8"), final(runs, 1, "reuse-m2")) < TOL
    m = runs[1]["results"]["reuse-m2"]["metrics"]
    assert 0.0 <= m["clipfrac"] <= 1.0


def test_zero2_matches_zero0_on_one_rank(runs):
    assert max_diff(final(runs, 1, "adam-seq-mean-token-mean-m8"), final(runs, 1, "adam-zero2-m4")) < TOL


@pytest.mark.parametrize("two, one", [
    ("adam-seq-mean-token-mean-z0-m4", "adam-seq-mean-token-mean-m8"),
    ("adam-seq-mean-token-mean-z2-m4", "adam-seq-mean-token-mean-m8"),
    ("adam-seq-mean-token-mean-z2-m2", "adam-seq-mean-token-mean-m8"),
    ("sgd-token-mean-z0-m4", "sgd-token-mean-m8"),
    ("sgd-constant-norm-z2-m2", "sgd-constant-norm-m8"),
    ("sgd-seq-mean-token-mean-z2-m4", "sgd-seq-mean-token-mean-m8"),
    ("mu2-m4", "mu2-m8"),
])
def test_world_size_does_not_change_the_update(runs, two, one):
    assert max_diff(final(runs, 2, two), final(runs, 1, one)) < TOL


def test_rank_local_normalisation_would_be_caught(runs):
    assert max_diff(final(runs, 2, "broken-token-mean-z0-m8"), final(runs, 1, "sgd-token-mean-m8")) > 1e-3


def test_global_denominator_sums_over_ranks(runs):
    one = runs[1]["results"]["adam-token-mean-m8"]
    two = runs[2]["results"]["sgd-token-mean-z0-m4"]
    assert two["rows_on_rank0"] == 8 and one["rows_on_rank0"] == 16
    assert one["denom"] == two["denom"]
    assert one["denom"][0] == 16 and one["denom"][2] == 16  # every row has a completion token; L = max_new_tokens
    for name in ("kl", "entropy", "clipfrac"):
        assert abs(runs[2]["results"]["adam-seq-mean-token-mean-z0-m4"]["metrics"][name]
                   - runs[1]["results"]["adam-seq-mean-token-mean-m8"]["metrics"][name]) < 1e-6, name


def test_world_size_does_not_change_minibatch_updates(runs):
    assert max_diff(final(runs, 2, "sgd-mb2-m4"), final(runs, 1, "sgd-mb2-m8")) < TOL


@pytest.mark.parametrize("world, name", [(1, "sgd-token-mean-tok70"), (1, "sgd-token-mean-tok50-packed"),
                                         (2, "sgd-token-mean-z3-tok45-packed")])
def test_token_budget_does_not_change_the_update(runs, world, name):
    res = runs[world]["results"][name]
    assert res["metrics"]["micro_batches"] > 2  # the budget cut each rank's rows into several forwards
    assert max_diff(final(runs, world, name), final(runs, 1, "sgd-token-mean-m8")) < TOL


def test_token_budget_ranks_agree_on_the_number_of_forwards(runs):
    res = runs[2]["results"]["sgd-token-mean-z3-tok45-packed"]
    alone = res["forwards_alone_per_rank"]
    assert alone[0] != alone[1], alone  # the ranks' rows differ in length: the agreement was needed
    assert res["metrics"]["micro_batches"] == max(alone)


def test_token_budget_with_reused_batches(runs):
    assert max_diff(final(runs, 1, "reuse-tok60"), final(runs, 1, "reuse-m8")) < TOL


@pytest.mark.parametrize("world, shared, plain", [(1, "sgd-token-mean-m8-shared", "sgd-token-mean-m8"),
                                                  (1, "sgd-token-mean-tok70-shared", "sgd-token-mean-m8"),
                                                  (1, "reuse-m2-shared", "reuse-m8"),
                                                  (2, "sgd-token-mean-z3-m4-shared", "sgd-token-mean-m8")])
def test_a_shared_prompt_forward_does_not_change_the_update(runs, world, shared, plain):
    """train.share_prompt: the old and reference log-probs and the update's gradients (SGD: the weight change
    is the gradient) equal the forward of every whole sequence, also where a forward holds part of a group."""
    assert max_diff(final(runs, world, shared), final(runs, 1, plain)) < TOL
    for name in ("kl", "entropy"):
        assert abs(runs[world]["results"][shared]["metrics"][name] - runs[1]["results"][plain]["metrics"][name]) < 1e-6
