"""Online RL: one loop for every RL preset (GRPO outcome/process, iterative, PPO, P3O, online RFT/DPO, ...).

    rlft train algo=grpo run.name=demo                      # from this run's SFT, rule reward
    rlft train algo=grpo algo.advantage=grpo_process run.name=demo   # PRM step rewards (stage:prm)
    rlft train algo=grpo iterative.iterations=2 reward=rm run.name=demo  # iterative, RM retrained
    rlft train algo=ppo run.name=demo                       # critic (critic.*), GAE
    rlft train algo=p3o run.name=demo                       # pairwise update (algo.pairwise_loss)

Each rollout step (docs/algorithms.md §4, Algorithm 1) is two parts:
  experience (rlft.stages.experience): sample G trajectories for this rank's share of
     `rollout.prompts_per_step` prompts through the environment, score them, old/reference
     log-probs, critic values and IS weights where needed, advantages from the registry;
  update (rlft.stages.update): mu passes of `minibatches_per_rollout` optimizer steps of the
     registered policy loss (or pairwise loss), then the critic's.
Each phase is timed (`time/<phase>_s` per rollout). The algorithms differ only in the registered
functions they name; the loop never asks which.
"""
from __future__ import annotations

import time

import torch
from omegaconf import OmegaConf

from rlft import dist
from rlft.algos import AdaptiveKLController, frac_zero_std_groups
from rlft.config.arithmetic import needs_reference, trains_critic, uses_teacher
from rlft.errors import ConfigError
from rlft.files.checkpoints import list_checkpoints
from rlft.model_source import resolve_model_path
from rlft.models import load_model, load_tokenizer
from rlft.rewards.scoring import RewardError
from rlft.rollout import batch as rb
from rlft.stages import common, iterative
from rlft.stages.experience import Experience
from rlft.stages.update import Update
from rlft.trainer import Trainer


def build_critic(cfg, tokenizer) -> Trainer:
    """PPO's critic: a scalar head on every token, from the RM (or another model), own optimizer."""
    critic_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    critic_cfg.train.lr = cfg.critic.lr
    path = resolve_model_path(cfg, cfg.critic.init)
    return Trainer(critic_cfg, load_model(cfg.model, path, tokenizer, head="rm", seed=cfg.seed, trained=True))


def load_reference(cfg, path: str, tokenizer) -> Trainer:
    """A frozen copy of the model at `path`: the KL anchor."""
    return Trainer(cfg, load_model(cfg.model, path, tokenizer, seed=cfg.seed), trainable=False)


def tokenizer_mismatch(student, teacher) -> str | None:
    """How two tokenizers differ in what a token id means (None: they agree on every id)."""
    a, b = student.get_vocab(), teacher.get_vocab()
    if len(a) != len(b):
        return f"vocabularies of {len(a)} and {len(b)} tokens"
    differ = sum(b.get(token) != i for token, i in a.items())
    if differ:
        return f"{differ} of {len(a)} tokens have other ids"
    if student.eos_token_id != teacher.eos_token_id:
        return f"end-of-sequence ids {student.eos_token_id} and {teacher.eos_token_id}"
    return None


def teacher_path(cfg, tokenizer) -> str:
    """The teacher's loadable path, once its tokenizer is known to be the student's (one line, before any model
    loads): the teacher scores the student's token ids, so both must read an id as the same token."""
    path = resolve_model_path(cfg, str(cfg.teacher.path))
    own = OmegaConf.create({"tokenizer": None, "trust_remote_code": bool(cfg.model.trust_remote_code)})
    try:
        theirs = load_tokenizer(own, path)
    except (OSError, ValueError):  # a folder without tokenizer files reads with model.tokenizer, as the student
        theirs = load_tokenizer(cfg.model, path)
    problem = tokenizer_mismatch(tokenizer, theirs)
    if problem:
        raise ConfigError(f"teacher.path={cfg.teacher.path}: its tokenizer is not the student's ({problem}); "
                          "distillation compares log-probs token by token, so pick a teacher of the student's "
                          "model family (cross-tokenizer distillation is not supported)")
    return path


class BaseModel:
    """The reference of a LoRA policy: the policy's forward with its adapter disabled (no second copy)."""

    def __init__(self, policy: Trainer):
        self.policy = policy

    @property
    def device(self) -> torch.device:
        return self.policy.device

    @property
    def module(self) -> torch.nn.Module:
        return self.policy.module

    def __call__(self, *args, **kwargs):
        with self.policy.adapter_disabled():
            return self.policy(*args, **kwargs)

    def head_context(self):
        """What the LM head runs under when called outside the forward (rlft/rollout/lm_head.py)."""
        return self.policy.adapter_disabled()


class KL:
    """The KL coefficient: fixed, or adaptive (§3: moved towards the target sequence KL each rollout)."""

    def __init__(self, a):
        self.coef = float(a.kl_coef)
        self.controller = AdaptiveKLController(self.coef, a.kl_target, a.kl_horizon) if a.adaptive_kl else None

    def restore(self, coef: float) -> None:
        self.coef = float(coef)
        if self.controller is not None:
            self.controller.value = self.coef

    def adapt(self, ro: rb.Rollout) -> None:
        old_logp, ref_logp = ro.get("old_logp"), ro.get("ref_logp")
        if self.controller is None or ref_logp is None or old_logp is None:
            return
        seq_kl = ((old_logp - ref_logp) * ro.mask).sum(-1)
        total, count = dist.all_reduce_sum([float(seq_kl.sum()), float(len(ro))])
        self.controller.update(total / max(count, 1.0), int(count))
        self.coef = float(self.controller.value)


def resume_hint(ctx: common.StageContext) -> str:
    """Where a stopped run continues from: its newest checkpoint and the command."""
    saved = list_checkpoints(ctx.ckpt_root)
    if not saved:
        return "no checkpoint written yet (train.save_every); fix it and rerun the same command"
    return f"last checkpoint {saved[-1]}; fix it and continue with the same command and resume=true"


def rollout_metrics(ro: rb.Rollout, stats: common.Sums, G: int) -> None:
    n = float(len(ro))
    stats.add("reward", float(ro.scores.sum()), n)
    stats.add("reward_sq", float((ro.scores ** 2).sum()), n)
    for name, values in ro.per_source.items():
        stats.add(f"reward/{name}", sum(values), n)
    lengths = [sum(w) for w in ro.token_mask] if ro.token_mask is not None else [len(c) for c in ro.completion_ids]
    stats.add("response_len", sum(lengths), n)  # tokens the model sampled (environment tokens not counted)
    for name, values in ro.episode.items():  # multi-turn: turns, tool calls and tool errors per trajectory
        stats.add(name, float(sum(values)), n)
    if ro.episode:
        stats.add("tool_use_frac", float(sum(c > 0 for c in ro.episode["tool_calls"])), n)
    stats.add("truncated_frac", float(ro.truncated.sum()), n)
    if ro.metrics:  # engine vs trainer log-probs on the response tokens
        tokens = float(ro.mask.sum())
        for name in ("engine_logp_gap_mean", "is_weight_mean", "is_corrected_frac"):
            if name in ro.metrics:
                stats.add(name, float(ro.metrics[name]) * tokens, tokens)
        if "engine_logp_gap_max" in ro.metrics:
            stats.add_max("engine_logp_gap_max", float(ro.metrics["engine_logp_gap_max"]))
    teacher_logp, old_logp = ro.get("teacher_logp"), ro.get("old_logp")
    if teacher_logp is not None and old_logp is not None:  # distillation: the sampled reverse KL, per model token
        stats.add("teacher_kl", float(((old_logp - teacher_logp) * ro.mask).sum()), float(ro.mask.sum()))
    if "staleness" in ro.metrics:  # asynchronous sampling: versions behind, and the sampler's own time
        stats.add("staleness_mean", float(ro.metrics["staleness"]), 1.0)
        stats.add_max("staleness_max", float(ro.metrics["staleness"]))
        stats.add("time/sampler_busy_s", float(ro.metrics["sampler_busy_s"]), 1.0)
    if G > 1:
        stats.add("frac_zero_std", float(frac_zero_std_groups(ro.scores, G)) * (n / G), n / G)


def build_models(cfg, parent: str, tokenizer) -> tuple:
    """(policy, reference, critic, teacher) of the RL stage, loaded in this order after seeding: the policy
    trained, the reference and teacher frozen (sharded alike), each None where the run needs none."""
    teacher_at = teacher_path(cfg, tokenizer) if uses_teacher(cfg) else None
    common.seed_everything(cfg.seed)
    policy = Trainer(cfg, load_model(cfg.model, parent, tokenizer, seed=cfg.seed, trained=True))
    reference = None
    if needs_reference(cfg):  # with LoRA the reference is the policy's own base weights (adapter off)
        reference = BaseModel(policy) if policy.has_adapter else load_reference(cfg, parent, tokenizer)
        if policy.has_adapter:
            dist.print0("[rlft] reference: the policy's base weights with its LoRA adapter off (no second copy)")
    critic = build_critic(cfg, tokenizer) if trains_critic(cfg) else None
    teacher = load_reference(cfg, teacher_at, tokenizer) if teacher_at else None
    if teacher is not None:
        weights = next(teacher.module.parameters())
        dist.print0(f"[rlft] teacher: {teacher_at} ({str(weights.dtype).removeprefix('torch.')} on {weights.device})")
    return policy, reference, critic, teacher


def restore(resumed: dict, rank: int, experience: Experience, kl: KL, iterations, steps_per_rollout: int) -> int:
    """Put a resumed checkpoint's loop state back (samples drawn, the adaptive KL coefficient, the difficulty
    pool and curriculum, the asynchronous sampler's rollouts in flight, the iteration's models); its step."""
    start_step = int(resumed.get("step", 0))
    experience.samples_drawn = int(resumed.get("samples_drawn", 0))
    if "kl_coef" in resumed:  # the adaptive KL controller's value when the checkpoint was written
        kl.restore(resumed["kl_coef"])
    if "prompts" in resumed:  # the difficulty pool and the curriculum as they were
        experience.prompt_source.restore(resumed["prompts"])
    if experience.ahead is not None and resumed.get("in_flight"):
        experience.ahead.restore(resumed["in_flight"][rank])
    if start_step and iterations.count > 1:  # the reward models and reference of the iteration resumed into
        iterations.restore(start_step // steps_per_rollout - 1, resumed.get("samples_log", []))
        common.set_rng_state(resumed["rng"])  # loading those models may have drawn random numbers
    return start_step


def run(cfg, ctx: common.StageContext) -> dict:
    common.prepare_run_dir(ctx)
    algo = cfg.algo
    parent = resolve_model_path(cfg)
    tokenizer = load_tokenizer(cfg.model, parent)
    policy, reference, critic, teacher = build_models(cfg, parent, tokenizer)
    experience = Experience.build(cfg, ctx.info, tokenizer, policy, reference, critic, model_path=parent,
                                  teacher=teacher)
    update = Update(cfg, policy, critic, teacher)
    kl = KL(algo)
    iterations = iterative.Iterations(cfg, ctx, experience, policy,
                                      lambda path: load_reference(cfg, path, tokenizer))

    steps_per_rollout = algo.updates_per_rollout * algo.minibatches_per_rollout
    companions = {"critic": critic} if critic is not None else None
    resumed = common.resume_state(ctx, policy, companions)
    start_step = restore(resumed, ctx.info.rank, experience, kl, iterations, steps_per_rollout)
    stats, times = common.Sums(), common.Sums()

    def run_rollout(r: int) -> None:
        if iterations.starts(r):
            iterations.next(r)
        if experience.ahead is not None:  # asynchronous: this version's weights out, rollouts up to r+K asked
            experience.schedule(r)
        try:
            ro = experience.collect(r, kl.coef)
        except RewardError as exc:  # the user's function: say where the run can continue from once it is fixed
            raise RewardError(f"{exc}; in rollout {r + 1} (step {r * steps_per_rollout}); {resume_hint(ctx)}") from None
        tic = time.time()
        update(ro, stats, r, kl.coef)
        kl.adapt(ro)
        phases = {**experience.take_times(), "update": time.time() - tic}
        for name, seconds in phases.items():
            times.add(f"time/{name}_s", seconds, 1)
        times.add("time/step_s", sum(phases.values()), 1)
        rollout_metrics(ro, stats, cfg.rollout.samples_per_prompt)
        iterations.record(ro)

    def logged(done: int) -> dict:
        nonlocal stats, times
        metrics = stats.reduce()
        metrics["reward_std"] = max(metrics.pop("reward_sq") - metrics["reward"] ** 2, 0.0) ** 0.5
        metrics.update(times.reduce(), **experience.prompt_source.metrics(), lr=policy.lr(),
                       iteration=iterations.index(done // steps_per_rollout - 1),
                       kl_coef=kl.coef, samples_seen=int(dist.all_reduce_sum([float(experience.samples_drawn)])[0]))
        stats, times = common.Sums(), common.Sums()
        return metrics

    def client_state() -> dict:
        state = {"kl_coef": kl.coef, "samples_drawn": experience.samples_drawn, **iterations.state()}
        if experience.prompt_source.adaptive:
            state["prompts"] = experience.prompt_source.state()
        if experience.ahead is not None:  # every rank's rollouts in flight: a resume trains the same samples
            state["in_flight"] = dist.all_gather_object(experience.ahead.drain())
        return state

    summary = common.training_loop(ctx, policy, start_step, run_rollout, logged, steps_per_unit=steps_per_rollout,
                                   evaluate=experience.greedy_accuracy, eval_every=algo.eval_every,
                                   eval_at_start=True, client_state=client_state, companions=companions)
    if critic is not None:
        critic.export_hf(ctx.run_dir / "critic", tokenizer)
    common.finish(ctx, policy, tokenizer, parent, summary)
    return summary
