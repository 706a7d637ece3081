"""Building and loading the models every stage uses.

Three heads over one backbone, all plain `transformers` classes so that any HF tool loads
rlft's checkpoints without custom code:
  * policy            AutoModelForCausalLM
  * outcome RM        AutoModelForSequenceClassification, num_labels=1 (score at the last token)
  * process RM (PRM)  AutoModelForTokenClassification, num_labels=1 (score at each step's last token)
"""
from __future__ import annotations

import torch

from rlft import lora
from rlft.files.handoff import BUILTIN_MODEL

HEADS = ("causal_lm", "rm", "prm")


def quiet_transformers() -> None:
    """No per-file progress bars from transformers (loading and writing weights): rlft's console shows
    its own progress, and a one-line error stays the only line on stderr."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def load_tokenizer(model_cfg, resolved_path: str):
    """The built-in char tokenizer for builtin:tiny, else the checkpoint's own tokenizer."""
    source = model_cfg.tokenizer or resolved_path
    if source in (BUILTIN_MODEL, "builtin:char"):
        from rlft.data.tokenizer import build_char_tokenizer

        return build_char_tokenizer()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source, trust_remote_code=model_cfg.trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_config(model_cfg, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size, num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads, num_key_value_heads=model_cfg.num_heads,
        max_position_embeddings=model_cfg.max_position_embeddings, rms_norm_eps=1e-5,
        tie_word_embeddings=model_cfg.tie_embeddings, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, num_labels=1,
    )


def _auto_class(head: str):
    import transformers

    return {"causal_lm": transformers.AutoModelForCausalLM,
            "rm": transformers.AutoModelForSequenceClassification,
            "prm": transformers.AutoModelForTokenClassification}[head]


_BEFORE_MODEL_GB: float | None = None


def memory_before_model_gb() -> float | None:
    """This process's peak resident memory (GiB) before its first model was loaded: the interpreter,
    libraries and data, which memory arithmetic (rlft.memory) takes as given. None before any load."""
    return _BEFORE_MODEL_GB


def load_model(model_cfg, resolved_path: str, tokenizer, head: str = "causal_lm", seed: int = 0,
               dtype: torch.dtype = torch.float32, trained: bool = False) -> torch.nn.Module:
    """A model with the requested head, from the built-in config or a checkpoint.

    A reward head on top of a causal-LM checkpoint starts from the checkpoint's backbone and
    a freshly initialised (seeded) scalar head. `trained`: the stage's trained model, whose base
    weights QLoRA (model.lora.load_in_4bit) loads in 4 bits on this rank's device."""
    global _BEFORE_MODEL_GB
    if _BEFORE_MODEL_GB is None:
        import resource

        _BEFORE_MODEL_GB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    quiet_transformers()
    if head not in HEADS:
        raise ValueError(f"unknown model head '{head}'; valid: {', '.join(HEADS)}")
    auto = _auto_class(head)
    torch.manual_seed(seed)
    impl = getattr(model_cfg, "attn_implementation", "auto")
    attention = {} if impl == "auto" else {"attn_implementation": impl}
    quantize = trained and lora.quantized(model_cfg)
    if resolved_path == BUILTIN_MODEL:
        if quantize:
            from rlft.errors import ConfigError

            raise ConfigError("model.lora.load_in_4bit=true loads a checkpoint's weights in 4 bits, and the built-in "
                             "model is built fresh; start from a checkpoint (e.g. model.path=stage:sft)")
        model = auto.from_config(tiny_config(model_cfg, tokenizer), **attention)
        model.to(dtype)
    else:
        kwargs = {"num_labels": 1} if head != "causal_lm" else {}
        if quantize:
            from rlft import dist

            kwargs.update(quantization_config=lora.quantization_config(dtype), device_map={"": dist.info().device})
        model = _from_pretrained(auto, head, resolved_path, dtype=dtype,
                                 trust_remote_code=model_cfg.trust_remote_code, **attention, **kwargs)
        if quantize:
            lora.keep_standard_layout(model)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def _from_pretrained(auto, head: str, path: str, **kwargs) -> torch.nn.Module:
    """`auto.from_pretrained`; a reward head on a causal-LM checkpoint says in one line that its scalar head starts
    fresh (in place of transformers' load report table), and names any other weight the checkpoint lacked."""
    if head == "causal_lm":
        return auto.from_pretrained(path, **kwargs)
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        model, info = auto.from_pretrained(path, output_loading_info=True, **kwargs)
    finally:
        logging.set_verbosity(level)
    backbone = f"{model.base_model_prefix}."
    fresh = sorted(k for k in info["missing_keys"] if not k.startswith(backbone))  # the head: score.*, classifier.*
    other = sorted(k for k in info["missing_keys"] if k not in fresh)
    from rlft import dist

    if fresh:
        dist.print0(f"[rlft] {head} head: {', '.join(fresh)} initialised fresh (seeded) on the backbone of {path}")
    if other:
        dist.print0(f"[rlft] warning: {path} lacks {len(other)} weight(s) the {head} model has, initialised fresh: "
                    f"{', '.join(other[:5])}{', ...' if len(other) > 5 else ''}")
    return model


def token_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scalar-head output at every position [B, T] (fp32), for RM and PRM models alike.

    Reading positions ourselves (instead of the HF pooling, which locates the last token by
    the pad id) keeps the score at the last real token even when pad == eos."""
    backbone = model.base_model
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return model.score(hidden).squeeze(-1).float()


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last attended position of each right-padded row [B]."""
    return attention_mask.long().sum(-1) - 1
