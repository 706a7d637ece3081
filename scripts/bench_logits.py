#!/usr/bin/env python3
"""Peak memory and step time of the LM head's five ways: the model's own logits (`today`:
`train.logit_chunk_tokens=0`, rlft before the chunked head), rlft's chunked head with each chunk recomputed in
the backward (`chunked`: what DPO's and every log-prob-only pass's gradients take), rlft's chunked head with the
per-token loss differentiated in the forward (`fused`: lm_head.head_loss, what the RL update's per-token losses
and SFT train through), liger-kernel's fused linear loss of the same terms (`liger`: train.fused_loss=liger,
rlft/rollout/liger.py; its GRPO loss is PyTorch, its SFT cross-entropy a Triton kernel that needs a GPU, so
this CPU benchmark measures liger on the GRPO update only) and TRL's fused LM head (`trl`:
`trl.trainer.utils.add_fused_lm_head`, what TRL 1.16's GRPOTrainer and SFTTrainer train through), on one
micro-batch of the GRPO update and of an SFT step, with and without activation checkpointing.

    python scripts/bench_logits.py                                    # SmolLM2's shape, 8 sequences
    python scripts/bench_logits.py --shapes qwen2-0.5b,smollm2-135m --micro 8,32 --rounds 2 --out bench_logits.jsonl
    python scripts/bench_logits.py --paths chunked --micro 64,128 --steps 1   # how large a micro-batch fits
    python scripts/bench_logits.py --shapes qwen2-0.5b --paths today,chunked,chunked@1024,fused@1024   # chunk sizes

Each measurement is its own process (a clean peak resident set), building the shape with random weights
in fp32 (nothing downloaded), a micro-batch of --micro sequences of --prompt-tokens + --response-tokens
random tokens, and AdamW. One step = the forward to per-token log-probs of the response tokens, the loss
(GRPO: the clipped policy loss with random advantages and the k3 KL to fixed reference log-probs, the
token entropy logged; SFT: the response tokens' negative log-likelihood, the argmax accuracy logged),
backward, optimizer step. --warmup steps are dropped, the median of the next --steps is the step time.
Configurations run in rounds, each round every configuration once, so a drift of the machine spreads over
all of them. Peak: the process's peak resident set (GiB) and its growth over the set-up (model, batch,
AdamW's states after the warm-up step excluded: what the step itself adds). A configuration killed for
memory or past --timeout is reported as such. Each measurement is appended to --out (JSON lines) as it
ends, and a rerun with the same --out skips the measurements already there, so a long benchmark resumes
where it stopped; the table is printed from everything in the file that matches the asked configurations.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from bench import SHAPES, build_model  # scripts/bench.py

PATHS = ("today", "chunked", "fused", "liger", "trl")


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def build(shape: str, checkpointing: bool, path: str):
    model = build_model(shape, seed=0)  # bench.py's shapes, random weights in fp32
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    if path == "trl":
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    return model


def batch(vocab: int, micro: int, prompt: int, response: int):
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (micro, prompt + response), generator=g)
    attn = torch.ones_like(ids)
    mask = torch.zeros(micro, prompt + response - 1)
    mask[:, prompt - 1:] = 1.0  # target columns of the response tokens
    adv = torch.randn(micro, 1, generator=g).expand_as(mask)
    ref = -torch.rand(micro, prompt + response - 1, generator=g) * 3
    return ids, attn, mask, adv, ref


def chunk_setting(path: str) -> None:
    """The chunk size a path runs with: `today` the model's own logits (0), `<path>@N` chunks of N tokens, else the
    default for the vocabulary."""
    from rlft.rollout import lm_head

    lm_head.DEFAULT_CHUNK_TOKENS = 0 if path == "today" else int(path.split("@")[1]) if "@" in path else None


def logp_of(model, path: str, ids, attn, mask, extra: str):
    """Per-token log-probs [B, L-1] (0 outside the mask) and one logged extra, through the path."""
    import torch

    from rlft.rollout.logprobs import response_start, token_logp

    if path == "trl":
        labels = torch.cat([torch.full_like(ids[:, :1], -100),
                            torch.where(mask.bool(), ids[:, 1:], torch.full_like(ids[:, 1:], -100))], 1)
        out = model(input_ids=ids, attention_mask=attn, labels=labels, fused_lm_head=True)
        value = out.entropy if extra == "entropy" else out.is_top1.float()
        return out.log_probs, value.detach()
    chunk_setting(path)
    logp, more = token_logp(model, ids, attn, 1.0, response_start(mask), mask=mask, extras=(extra,))
    return logp, more[extra]


def token_terms(stage: str):
    """The stage's loss as per-token terms (lm_head.TokenLoss.fn): GRPO the clipped policy loss with the
    advantages plus 0.04 x k3 to the reference log-probs; SFT the negative log-likelihood; each over the
    micro-batch's response tokens."""
    import torch

    def grpo(logp, t, _divergence=None):
        ratio = torch.exp(logp - logp.detach())
        policy = -torch.min(ratio * t["adv"], ratio.clamp(0.8, 1.2) * t["adv"])
        kl = torch.exp(t["ref"] - logp) - (t["ref"] - logp) - 1  # k3
        return (policy + 0.04 * kl) * t["weight"]

    def sft(logp, t, _divergence=None):
        return -logp * t["weight"]
    return grpo if stage == "grpo" else sft


def liger_kernel(model, stage: str):
    """liger-kernel's fused loss of `token_terms` (lm_head.TokenLoss.kernel), as train.fused_loss=liger builds it."""
    from rlft.rollout.liger import nll_kernel, policy_kernel
    from rlft.rollout.lm_head import chunk_tokens_of

    return policy_kernel(0.2, 0.2, 0.04, 1.0, chunk_tokens_of(model)) if stage == "grpo" else nll_kernel()


def step(model, opt, path: str, stage: str, data) -> None:
    from rlft.rollout.lm_head import TokenLoss
    from rlft.rollout.logprobs import response_start, token_logp

    ids, attn, mask, adv, ref = data
    fn, extra = token_terms(stage), "entropy" if stage == "grpo" else "top1"
    inputs = {"adv": adv, "ref": ref, "weight": mask / mask.sum()}
    if path.startswith(("fused", "liger")):
        chunk_setting(path)
        kernel = liger_kernel(model, stage) if path.startswith("liger") else None
        _, _, loss = token_logp(model, ids, attn, 1.0, response_start(mask), mask=mask, extras=(extra,),
                                loss=TokenLoss(fn, inputs, kernel))
    else:
        logp, _ = logp_of(model, path, ids, attn, mask, extra)
        where = mask.bool()
        loss = fn(logp[where], {name: x[where] for name, x in inputs.items()}).sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def worker(spec: dict) -> dict:
    """One configuration in this process: warm-up and timed steps, peak memory."""
    import torch

    torch.set_num_threads(spec["threads"])
    model = build(spec["shape"], spec["checkpointing"], spec["path"])
    data = batch(SHAPES[spec["shape"]]["vocab_size"], spec["micro"], spec["prompt"], spec["response"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for p in model.parameters():  # AdamW's states before the first step, so the warm-up measures the step alone
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    setup = rss_gib()
    times = []
    for k in range(spec["warmup"] + spec["steps"]):
        start = time.perf_counter()
        step(model, opt, spec["path"], spec["stage"], data)
        if k >= spec["warmup"]:
            times.append(time.perf_counter() - start)
    peak = rss_gib()
    return {"step_s": times, "peak_gib": peak, "setup_gib": setup, "step_growth_gib": peak - setup}


def run_one(spec: dict, timeout: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "MALLOC_MMAP_THRESHOLD_": "1048576"}
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"past {timeout:.0f} s"}
    if proc.returncode:
        killed = proc.returncode in (-9, 137)
        return {"error": "killed (memory)" if killed else proc.stderr.strip().splitlines()[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: list[dict]) -> str:
    lines = ["| shape | stage | micro | checkpointing | path | step s (median) | peak GiB | step's growth GiB | vs today (peak) |",
             "|---|---|---|---|---|---|---|---|---|"]
    today = {(r["shape"], r["stage"], r["micro"], r["checkpointing"]): r for r in results if r["path"] == "today"}
    for r in results:
        key = (r["shape"], r["stage"], r["micro"], r["checkpointing"])
        if "error" in r:
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {r['path']} | {r['error']} | | | |")
            continue
        base = today.get(key)
        ratio = f"{r['peak_gib'] / base['peak_gib']:.2f}" if base and "peak_gib" in base else ""
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {r['path']} | {statistics.median(r['step_s']):.2f} | "
                     f"{r['peak_gib']:.2f} | {r['step_growth_gib']:.2f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default="smollm2-135m")
    ap.add_argument("--stages", default="grpo,sft")
    ap.add_argument("--micro", default="8")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--checkpointing", default="on,off")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--response-tokens", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", help="JSON lines file: each measurement appended as it ends; rerun to resume")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    combos = list(itertools.product(args.shapes.split(","), args.stages.split(","), map(int, args.micro.split(",")),
                                    [c == "on" for c in args.checkpointing.split(",")], args.paths.split(",")))
    combos = [c for c in combos if not (c[4].startswith("liger") and c[1] == "sft")]  # a Triton kernel: GPU only
    settings = dict(prompt=args.prompt_tokens, response=args.response_tokens, warmup=args.warmup, steps=args.steps,
                    threads=args.threads)
    done = read_done(args.out, settings)
    runs: dict[tuple, list[dict]] = {c: list(done.get(c, [])) for c in combos}
    for rnd in range(args.rounds):
        for combo in combos:
            if len(runs[combo]) > rnd:
                continue  # measured by an earlier invocation with this --out
            shape, stage, micro, ckpt, path = combo
            spec = dict(shape=shape, stage=stage, micro=micro, checkpointing=ckpt, path=path, **settings)
            started = time.time()
            out = run_one(spec, args.timeout)
            runs[combo].append(out)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"spec": spec, "result": out}) + "\n")
            said = out.get("error") or f"{statistics.median(out['step_s']):.2f} s/step, peak {out['peak_gib']:.2f} GiB"
            print(f"[bench_logits] round {rnd + 1}/{args.rounds} {combo}: {said} ({time.time() - started:.0f} s)",
                  flush=True)
    results = []
    for (shape, stage, micro, ckpt, path), outs in runs.items():
        row = dict(shape=shape, stage=stage, micro=micro, checkpointing=ckpt, path=path)
        good = [o for o in outs if "error" not in o]
        if not good:
            row["error"] = outs[0]["error"]
        else:
            row.update(step_s=[t for o in good for t in o["step_s"]], peak_gib=max(o["peak_gib"] for o in good),
                       step_growth_gib=max(o["step_growth_gib"] for o in good))
        results.append(row)
    print(table(results))


def read_done(path: str | None, settings: dict) -> dict[tuple, list[dict]]:
    """Measurements an earlier invocation appended to `path` with the same token counts, steps and threads."""
    done: dict[tuple, list[dict]] = {}
    if not path or not os.path.exists(path):
        return done
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            spec, out = record["spec"], record["result"]
            if all(spec[k] == v for k, v in settings.items()):
                key = (spec["shape"], spec["stage"], spec["micro"], spec["checkpointing"], spec["path"])
                done.setdefault(key, []).append(out)
    return done


if __name__ == "__main__":
    main()
