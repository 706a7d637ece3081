"""Checks that types alone cannot make, each a one-line ConfigError with the fix: ranges, batch arithmetic,
registered names, and options a run sets but never reads. (Fixed string choices are `Choice` enums, which
OmegaConf checks when the config is composed.)"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Iterator, Optional, Sequence

from rlft.config.algorithms import algo_spec
from rlft.config.arithmetic import advantage_needs, derive, distill_sampled, trains_critic, uses_teacher
from rlft.config.defaults import fill
from rlft.config.fields import read_rule
from rlft.config.schema import SECTIONS, RolloutConfig
from rlft.errors import ConfigError


def _check_choice(key: str, value: Any, choices: list) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def validate(cfg, recorded: Optional[dict] = None, given: Sequence[str] = ()) -> dict[str, str]:
    """Fill what the config leaves to the defaults table (from `recorded`, a resumed checkpoint's config, where
    it has the key) and what follows from other values, then check values that types alone cannot; raise
    ConfigError with a one-line fix. `given`: the command line's overrides (`key=value`). Returns where each
    table-filled value came from. (Fixed string choices are `Choice` enums, which OmegaConf checks when the
    config is composed.)"""
    validate_run(cfg.run)
    if algo_spec(cfg.algo).rl:
        validate_rl_names(cfg.algo)  # the defaults table reads the registries' option lists by these names
    filled = fill(cfg, recorded, unread=lambda key: is_unread(cfg, key))
    derive(cfg)
    train, ds_opts = cfg.train, cfg.deepspeed
    if algo_spec(cfg.algo).rl:
        validate_rl(cfg)
    validate_numbers(cfg)
    check_unused_options(cfg)
    check_builtin_only(cfg)
    from rlft.envs import env_class

    env_class(str(cfg.env.name))  # an unknown environment or import path: one line, before anything starts
    check_given_env_options(cfg, given)
    _check_choice("deepspeed.zero_stage", ds_opts.zero_stage, [0, 1, 2, 3])
    validate_rollout(cfg.rollout)
    for key, value in [("train.max_steps", train.max_steps), ("train.batch_size", train.batch_size),
                       ("train.micro_batch_per_device", train.micro_batch_per_device),
                       ("deepspeed.nproc_per_node", ds_opts.nproc_per_node), ("deepspeed.nnodes", ds_opts.nnodes),
                       ("train.max_seq_len", train.max_seq_len), ("rollout.samples_per_prompt",
                                                                  cfg.rollout.samples_per_prompt),
                       ("rollout.prompts_per_step", cfg.rollout.prompts_per_step)]:
        if value < 1:
            raise ConfigError(f"{key}={value} must be at least 1")
    if train.share_prompt and train.packing:
        raise ConfigError("train.share_prompt=true and train.packing=true are two ways to skip work in the same "
                          "forward; use one (share_prompt for short completions after long prompts)")
    if train.max_tokens_per_micro_batch < 0:
        raise ConfigError(f"train.max_tokens_per_micro_batch={train.max_tokens_per_micro_batch} must be 0 (off: "
                          "train.micro_batch_per_device sequences per forward) or a token budget")
    if train.logit_chunk_tokens is not None and train.logit_chunk_tokens < 0:
        raise ConfigError(f"train.logit_chunk_tokens={train.logit_chunk_tokens} must be null (by vocabulary), 0 (the "
                          "model's own logits) or a number of tokens")
    if str(train.fused_loss) == "liger":
        from rlft.rollout.liger import check_config

        check_config(cfg)
    if cfg.model.lora.load_in_4bit:
        if cfg.model.lora.rank <= 0:
            raise ConfigError("model.lora.load_in_4bit=true quantizes the base under a LoRA adapter; set "
                              "model.lora.rank (e.g. 16) or drop load_in_4bit")
        if ds_opts.zero_stage == 3:
            raise ConfigError("model.lora.load_in_4bit=true cannot be sharded by ZeRO-3 (4-bit weights are not "
                              "partitioned); use deepspeed.zero_stage=0, 1 or 2 (the base is 4 bits on every rank)")
    if not 0 <= ds_opts.node_rank < ds_opts.nnodes:
        raise ConfigError(f"deepspeed.node_rank={ds_opts.node_rank} must be in [0, deepspeed.nnodes={ds_opts.nnodes})")
    world = ds_opts.nproc_per_node * ds_opts.nnodes
    per_step = train.micro_batch_per_device * world
    if train.batch_size % per_step:
        raise ConfigError(
            f"train.batch_size={train.batch_size} is not a multiple of train.micro_batch_per_device x ranks "
            f"= {train.micro_batch_per_device} x {world}; change one of them")
    if ds_opts.nnodes > 1 and ds_opts.master_port == 0:
        raise ConfigError("deepspeed.master_port=0 cannot be used with deepspeed.nnodes>1; set the same port on "
                          "every node")
    bad_k = [k for k in cfg.eval.k if k > cfg.eval.samples or k < 1]
    if bad_k:
        raise ConfigError(f"eval.k={list(cfg.eval.k)} has values outside [1, eval.samples={cfg.eval.samples}]")
    return filled


RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=,+@-]*")


def validate_run(run) -> None:
    """run.name names one folder under run.root: not a path, not empty (a run writes only under its root)."""
    name = "" if run.name is None else str(run.name)
    if not RUN_NAME.fullmatch(name) or name in (".", ".."):
        shown = repr(name) if name else "empty"
        raise ConfigError(f"run.name={shown} is not a run name: one folder name under run.root (letters, digits and "
                          "_ . - = , + @, not starting with . or -), not a path; to write elsewhere set "
                          "run.root=<folder> (or run.dir=<folder> for one stage)")
    if not str(run.root or "").strip():
        raise ConfigError("run.root is empty: set the folder that holds the runs (default runs)")


def _in_range(key: str, value: float, low: float | None, high: float | None = None, *, open_low: bool = False,
              why: str = "") -> None:
    """ConfigError naming the allowed range when value is outside [low, high] ((low, high] with open_low)."""
    bad = (low is not None and (value <= low if open_low else value < low)) or (high is not None and value > high)
    if bad or (isinstance(value, float) and math.isnan(value)):
        lo = "" if low is None else (f"> {low}" if open_low else f">= {low}")
        hi = "" if high is None else f"<= {high}"
        rule = " and ".join(x for x in (lo, hi) if x)
        raise ConfigError(f"{key}={value} must be {rule}" + (f" ({why})" if why else ""))


def validate_numbers(cfg) -> None:
    """The numbers a user can get wrong, checked before anything starts (each with its allowed range)."""
    train, rollout, ev = cfg.train, cfg.rollout, cfg.eval
    _in_range("train.lr", train.lr, 0.0)
    _in_range("train.weight_decay", train.weight_decay, 0.0)
    _in_range("train.warmup_steps", train.warmup_steps, 0)
    _in_range("train.grad_clip", train.grad_clip, 0.0, why="0: no clipping")
    samples = algo_spec(cfg.algo).samples if cfg.algo is not None else False
    if samples:  # stages that sample from the policy
        _in_range("rollout.temperature", rollout.temperature, 0.0, open_low=True,
                  why="training samples come from the policy's distribution; greedy decoding is what eval reports")
        _in_range("rollout.top_p", rollout.top_p, 0.0, 1.0, open_low=True)
        _in_range("rollout.top_k", rollout.top_k, 0, why="0: off")
        _in_range("rollout.max_new_tokens", rollout.max_new_tokens, 1)
    _in_range("eval.temperature", ev.temperature, 0.0, open_low=True,
              why="the sampled metrics (pass@k, maj@k) need samples; greedy accuracy is always reported")
    _in_range("eval.top_p", ev.top_p, 0.0, 1.0, open_low=True)
    _in_range("eval.max_new_tokens", ev.max_new_tokens, 1)
    if algo_spec(cfg.algo).rl if cfg.algo is not None else False:
        algo = cfg.algo
        _in_range("algo.clip_eps_low", algo.clip_eps_low, 0.0, open_low=True)
        _in_range("algo.clip_eps_high", algo.clip_eps_high, 0.0, open_low=True)
        if trains_critic(cfg):
            _in_range("critic.lr", cfg.critic.lr, 0.0)


def validate_rollout(rollout) -> None:
    from rlft.algos import IS_CORRECTIONS
    from rlft.rollout.sampling import ENGINES

    _check_choice("rollout.engine", rollout.engine, list(ENGINES))
    _check_choice("rollout.is_correction", rollout.is_correction, ["auto"] + IS_CORRECTIONS.names())
    if rollout.is_cap <= 1.0:
        raise ConfigError(f"rollout.is_cap={rollout.is_cap} must be above 1 (weights are capped or masked past it)")
    defaults = RolloutConfig()
    for f in dataclasses.fields(RolloutConfig):  # an engine's option section checks its own values
        check = getattr(type(getattr(defaults, f.name)), "check", None)
        if check is not None:
            check(getattr(rollout, f.name), rollout)
    if rollout.max_staleness < 0 or rollout.sampler_threads < 0:
        raise ConfigError(f"rollout.max_staleness={rollout.max_staleness} and rollout.sampler_threads="
                          f"{rollout.sampler_threads} must be >= 0")
    if rollout.max_new_tokens < 0 or rollout.batch_size < 1:
        raise ConfigError("rollout.max_new_tokens must be >= 0 and rollout.batch_size >= 1")


# ----------------------------------------------------------------------------- options a run never reads
def _pairwise_loss(cfg):
    return cfg.algo.pairwise_loss if algo_spec(cfg.algo).rl else None


def _iterative(cfg) -> bool:
    return algo_spec(cfg.algo).rl and cfg.iterative.iterations > 1


def _process_advantage(cfg) -> bool:
    return advantage_needs(cfg, "step_scores")


def _critic_unread(cfg, key):
    if not trains_critic(cfg):
        return f"algo={cfg.algo.name} trains no critic (only an algo.advantage that needs one does)"


def _teacher_unread(cfg, key):
    if not uses_teacher(cfg):
        return "no teacher is read (only an algo.advantage that needs one: distill)"


def _divergence_unread(cfg, key):
    if not uses_teacher(cfg) or distill_sampled(cfg.algo):
        return "only a full-distribution distillation divergence (algo.distill_divergence) reads it"


def _jsd_unread(cfg, key):
    if not uses_teacher(cfg) or str(cfg.algo.distill_divergence) != "jsd":
        return "only algo.distill_divergence=jsd reads it"


def _outcome_weight_unread(cfg, key):
    if not (_process_advantage(cfg) or uses_teacher(cfg)):
        return ("only process supervision (grpo_process|grpo_process_min) and distillation (distill) add the "
                "outcome advantage")


def _loss_option_unread(cfg, key):
    from rlft.algos import PAIRWISE_LOSSES, POLICY_LOSSES

    if not algo_spec(cfg.algo).rl:
        return f"algo={cfg.algo.name} has no policy loss"
    loss = _pairwise_loss(cfg)
    registry, chosen = (PAIRWISE_LOSSES, f"algo.pairwise_loss={loss}") if loss else \
        (POLICY_LOSSES, f"algo.policy_loss={cfg.algo.policy_loss} (algo.pairwise_loss=None)")
    if key not in registry.meta(loss or cfg.algo.policy_loss).get("options", ()):
        return f"algo={cfg.algo.name} with {chosen} does not read it"


def _per_token_update_unread(cfg, key):
    if _pairwise_loss(cfg):
        return f"a pairwise update (algo.pairwise_loss={cfg.algo.pairwise_loss}) does not read it"


def _process_advantage_unread(cfg, key):
    if not _process_advantage(cfg):
        return ("only process supervision (an algo.advantage that reads step scores: "
                "grpo_process|grpo_process_min) reads it")


def _iterative_unread(cfg, key):
    if not _iterative(cfg):
        return "it applies only with iterative.iterations > 1 in an RL run"


def _iterative_mc_labels_unread(cfg, key):
    return _iterative_unread(cfg, key) or (
        "it applies only with iterative.step_labels=mc" if cfg.iterative.step_labels != "mc" else None)


def _policy_source_unread(cfg, key):
    if getattr(cfg.algo, "source", None) != "policy":
        return "it applies only with algo.source=policy"


def _rl_loop_unread(cfg, key):
    if not algo_spec(cfg.algo).rl:
        return f"only the online RL loop reads it, not algo={cfg.algo.name}"


def _pool_unread(cfg, key):
    return _rl_loop_unread(cfg, key) or (
        "it applies only with rollout.pool.enabled=true" if not cfg.rollout.pool.enabled else None)


def _curriculum_unread(cfg, key):
    from rlft.envs import env_class
    from rlft.envs.base import Environment

    if not algo_spec(cfg.algo).rl:
        return f"only the online RL loop reads it, not algo={cfg.algo.name}"
    if env_class(str(cfg.env.name)).curriculum_levels is Environment.curriculum_levels:
        return f"env={cfg.env.name} has no difficulty levels (env=reasoning_gym has its tasks' curricula)"


def _curriculum_on_unread(cfg, key):
    return _curriculum_unread(cfg, key) or (
        "it applies only with env.curriculum.enabled=true" if not cfg.env.curriculum.enabled else None)


def _async_unread(cfg, key):
    if int(cfg.rollout.max_staleness) == 0:
        return "only asynchronous sampling (rollout.max_staleness > 0) reads it"


def _adaptive_kl_unread(cfg, key):
    if not getattr(cfg.algo, "adaptive_kl", False):
        return "only the adaptive KL controller (algo.adaptive_kl=true) reads it"


def _engine_unread(cfg, key, engine):
    chosen = str(cfg.rollout.engine)
    if chosen not in ("auto", engine):
        return f"only the {engine} rollout engine reads it (rollout.engine={chosen})"


# read_when rule (rlft/config/fields.py) -> (cfg, field name) -> why this run does not read it, or None
READ_RULES: dict[str, Callable[..., Optional[str]]] = {
    "async": _async_unread,
    "curriculum": _curriculum_unread,
    "curriculum_on": _curriculum_on_unread,
    "pool": _pool_unread,
    "critic": _critic_unread,
    "teacher": _teacher_unread,
    "outcome_weight": _outcome_weight_unread,
    "divergence": _divergence_unread,
    "jsd": _jsd_unread,
    "loss_option": _loss_option_unread,
    "per_token_update": _per_token_update_unread,
    "process_advantage": _process_advantage_unread,
    "rl_loop": _rl_loop_unread,
    "iterative": _iterative_unread,
    "iterative_mc_labels": _iterative_mc_labels_unread,
    "policy_source": _policy_source_unread,
    "adaptive_kl": _adaptive_kl_unread,
    "engine": _engine_unread,  # engine:<name>: an option of that rollout engine's
}


def why_unread(rule: str, cfg, key: str) -> Optional[str]:
    """Why this run never reads option `key` under its declared rule, or None; a rule `name:arg` (engine:hf)
    passes its argument on."""
    name, _, arg = rule.partition(":")
    return READ_RULES[name](cfg, key, arg) if arg else READ_RULES[name](cfg, key)


def unread_options(section_name: str, section, schema: type, cfg) -> Iterator[tuple[str, str]]:
    """(`section.key=value`, why it is not read) for each option of a section (nested ones too) that is set
    to other than its schema default and that its declared rule says this run never reads."""
    default = schema()
    for f in dataclasses.fields(schema):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(getattr(default, f.name)):
            yield from unread_options(f"{section_name}.{f.name}", value, type(getattr(default, f.name)), cfg)
            continue
        rule = read_rule(schema, f)
        if rule is None or value == getattr(default, f.name):
            continue
        why = why_unread(rule, cfg, f.name)
        if why:
            yield f"{section_name}.{f.name}={value}", why


def is_unread(cfg, key: str) -> bool:
    """Whether this run never reads a dotted `section.option` key (its declared `read_when` rule)."""
    section, name = key.split(".")
    schema = algo_spec(cfg.algo).schema if section == "algo" else SECTIONS[section]
    field = next(f for f in dataclasses.fields(schema) if f.name == name)
    rule = read_rule(schema, field)
    return bool(rule and why_unread(rule, cfg, name))


def check_unused_options(cfg) -> None:
    """A preset or override that sets an option this run never reads is refused (it would silently do
    nothing). Which runs read an option is declared with the option (`read_when` in the schema)."""
    for name, schema in SECTIONS.items():
        section = getattr(cfg, name)
        if name == "algo":
            schema = algo_spec(section).schema
        if not dataclasses.is_dataclass(schema):
            continue
        for option, why in unread_options(name, section, schema, cfg):
            raise ConfigError(f"{option} is set but never used: {why}; remove it")


EVERY_ENV_READS = ("name", "max_turns", "max_env_tokens", "curriculum")


def check_given_env_options(cfg, given: Sequence[str]) -> None:
    """An env.* option set on the command line that the chosen built-in environment never reads is refused
    (its class declares `options_read`). Only the command line's: a recipe sets one environment's options, and
    switching `env=` on top of it is how a user moves the recipe to another environment."""
    from rlft.envs import BUILTIN, env_class

    name = str(cfg.env.name)
    if name not in BUILTIN:
        return  # a user environment may read any env.* option
    reads = EVERY_ENV_READS + env_class(name).options_read
    for override in given:
        key = override.split("=", 1)[0].lstrip("+~")
        section, _, option = key.partition(".")
        if section == "env" and option and option.split(".")[0] not in reads:
            raise ConfigError(f"{key} is set but never used: env={name} does not read it (its options: "
                              f"{', '.join('env.' + o for o in reads[1:])}); remove it")


def check_builtin_only(cfg) -> None:
    """Options that check steps against the built-in task's worked solutions need the built-in task."""
    if cfg.data.source == "builtin:arith":
        return
    if getattr(cfg.algo, "labels", None) == "exact" and getattr(cfg.algo, "source", None) == "policy":
        raise ConfigError("algo.labels=exact checks steps against the built-in task's worked solutions; with "
                          "other data use algo.labels=mc")
    if _iterative(cfg) and cfg.iterative.step_labels == "exact":
        raise ConfigError("iterative.step_labels=exact checks steps against the built-in task's worked "
                          "solutions; with other data use iterative.step_labels=mc")
    if cfg.reward.process != "prm" and _process_advantage(cfg):
        raise ConfigError("reward.process=exact checks steps against the built-in task's worked solutions; "
                          "with other data use a PRM (reward.process=prm)")


def validate_rl_names(algo) -> None:
    from rlft.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, PAIRWISE_LOSSES, POLICY_LOSSES

    for key, registry in [("advantage", ADVANTAGES), ("policy_loss", POLICY_LOSSES),
                          ("loss_agg", AGGREGATIONS), ("kl_estimator", KL_ESTIMATORS)]:
        _check_choice(f"algo.{key}", getattr(algo, key), registry.names())
    if algo.pairwise_loss is not None:
        _check_choice("algo.pairwise_loss", algo.pairwise_loss, PAIRWISE_LOSSES.names())


def check_divergence(algo, train) -> None:
    from rlft.algos.divergence import DIVERGENCES

    _check_choice("algo.distill_divergence", str(algo.distill_divergence), ["sampled"] + DIVERGENCES.names())
    if distill_sampled(algo):
        return
    if not 0.0 < algo.distill_beta < 1.0 or algo.distill_top_k < 0:
        raise ConfigError(f"algo.distill_beta={algo.distill_beta} must be in (0, 1) and algo.distill_top_k="
                          f"{algo.distill_top_k} >= 0 (0: the whole vocabulary)")
    if train.logit_chunk_tokens == 0:
        raise ConfigError(f"algo.distill_divergence={algo.distill_divergence} runs the student's and the teacher's "
                          "LM heads together a chunk of tokens at a time: set train.logit_chunk_tokens > 0")


def validate_rl(cfg) -> None:
    from rlft.algos import ADVANTAGES, PAIRWISE_LOSSES

    algo, rollout, world = cfg.algo, cfg.rollout, cfg.deepspeed.nproc_per_node * cfg.deepspeed.nnodes
    if algo.kl_coef < 0:
        raise ConfigError(f"algo.kl_coef={algo.kl_coef} must be >= 0")
    if rollout.max_staleness and rollout.dynamic_sampling:
        raise ConfigError("rollout.dynamic_sampling=true samples again within a rollout from the current weights, "
                          "which asynchronous sampling (rollout.max_staleness > 0) does not; use one of them")
    if algo.pairwise_loss is not None:
        if not PAIRWISE_LOSSES.needs(algo.pairwise_loss, "kl_coef") and algo.kl_coef != 0:
            raise ConfigError(f"algo.kl_coef={algo.kl_coef} is set but never used: algo.pairwise_loss="
                              f"{algo.pairwise_loss} does not read it (its KL strength is pairwise.beta); set 0")
        if "beta" in PAIRWISE_LOSSES.meta(algo.pairwise_loss).get("options", ()) and cfg.pairwise.beta <= 0:
            raise ConfigError(f"pairwise.beta={cfg.pairwise.beta} must be > 0 (DPO's strength of the KL to the "
                              "reference)")
        if rollout.samples_per_prompt % 2 or cfg.train.micro_batch_per_device % 2:
            raise ConfigError(f"a pairwise loss pairs completions of one prompt: rollout.samples_per_prompt="
                              f"{rollout.samples_per_prompt} and train.micro_batch_per_device="
                              f"{cfg.train.micro_batch_per_device} must both be even")
    elif algo.kl_in == "reward" and algo.kl_coef > 0 and not ADVANTAGES.needs(algo.advantage, "kl_reward"):
        raise ConfigError(f"algo.kl_in=reward, but algo.advantage={algo.advantage} puts no KL into its rewards; set "
                          f"algo.advantage={'|'.join(ADVANTAGES.names_needing('kl_reward'))} or algo.kl_in=loss")
    elif rollout.samples_per_prompt < 2 and (ADVANTAGES.needs(algo.advantage, "groups") or (
            uses_teacher(cfg) and algo.outcome_weight)):
        raise ConfigError(f"rollout.samples_per_prompt={rollout.samples_per_prompt}: group-relative advantages "
                          f"(algo.advantage={algo.advantage}) need groups of at least 2 completions")
    if uses_teacher(cfg) and not str(cfg.teacher.path):
        raise ConfigError(f"algo.advantage={algo.advantage} scores every sampled token with a teacher: set teacher.path "
                          "(a stronger model with the student's tokenizer: stage:<algo>, a folder, a hub id)")
    if uses_teacher(cfg):
        check_divergence(algo, cfg.train)
    shards = algo.minibatches_per_rollout * world
    if rollout.prompts_per_step % shards:
        raise ConfigError(f"rollout.prompts_per_step={rollout.prompts_per_step} must be divisible by "
                          f"algo.minibatches_per_rollout x ranks = {algo.minibatches_per_rollout} x {world}")
    iterations = cfg.iterative.iterations
    per_iteration = algo.updates_per_rollout * algo.minibatches_per_rollout * iterations
    if iterations < 1 or cfg.train.max_steps % per_iteration:
        raise ConfigError(
            f"train.max_steps={cfg.train.max_steps} must be a multiple of algo.updates_per_rollout x "
            f"algo.minibatches_per_rollout x iterative.iterations = {per_iteration} (optimizer steps per iteration)")
