"""LoRA adapters through peft, on the trainable model of any stage (`model.lora.rank > 0`).

The adapter is injected into the transformers model itself (peft's LoRA layers replace the targeted
Linear layers), so every forward in rlft -- causal LM, reward and value heads, generation -- runs
through it unchanged. Only the adapter trains, plus a reward or value model's scalar head. What rlft
writes stays a plain Hugging Face model:

    peft_copy           a CPU PeftModel of the adapted model: its save_pretrained writes the adapter folder,
                        its merge_and_unload gives final/'s weights; the trainer's model is untouched
    merged_weights      each adapted weight merged by peft's get_delta_weight, for a rollout engine's sync
    merged_folder       an adapter folder given as model.path, merged once onto its base (PeftModel loads it)
    adapter_disabled    the base model for the duration: RL's reference without a second copy

QLoRA (`model.lora.load_in_4bit`): the base is loaded in 4 bits by transformers' bitsandbytes support;
what rlft writes or syncs is dequantized first (dequantized_state_dict, plain_weight), so final/ is
the same plain model.

docs/lora.md has the options and what was tested.
"""
from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch

BASE = ".base_layer."
ADAPTER = "default"  # peft's name for the one adapter rlft trains


def enabled(model_cfg) -> bool:
    return int(model_cfg.lora.rank) > 0


def quantized(model_cfg) -> bool:
    """QLoRA: the trained model's base weights in 4 bits (model.lora.load_in_4bit)."""
    return enabled(model_cfg) and bool(getattr(model_cfg.lora, "load_in_4bit", False))


def quantization_config(compute_dtype: torch.dtype):
    """transformers' bitsandbytes config for QLoRA's base: NF4 with double quantization (the QLoRA paper's),
    matmuls in the training precision."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ImportError("model.lora.load_in_4bit=true needs bitsandbytes: pip install bitsandbytes") from None
    from transformers import BitsAndBytesConfig

    # the output layer and the reward/value heads (`score`, trained whole) stay in full precision
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype, llm_int8_skip_modules=["lm_head", "score"])


def keep_standard_layout(model: torch.nn.Module) -> None:
    """On CPUs with AVX512-BF16, bitsandbytes repacks a 4-bit weight into its CPU kernel's layout at the first
    no-grad forward (a sampling step). rlft reads the 4-bit weights in the standard layout (merging, export,
    the reference's forward), and the repacking fails outright for layers narrower than a quantization block
    ("shape '[32, 0]' is invalid"); so every 4-bit layer keeps the standard layout."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def is_4bit(p) -> bool:
    return type(p).__name__ == "Params4bit"


def plain_weight(p: torch.Tensor) -> torch.Tensor:
    """A weight as a plain model holds it: a 4-bit (QLoRA) base weight dequantized, any other as it is."""
    if not is_4bit(p):
        return p
    import bitsandbytes as bnb

    return bnb.functional.dequantize_4bit(p.data, p.quant_state)


def dequantized_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with every 4-bit base weight dequantized and its quantization statistics (the
    `<weight>.absmax`, `.quant_map`, ... entries) dropped; unchanged for a model without 4-bit weights."""
    quant = {name: p for name, p in model.named_parameters() if is_4bit(p)}
    if not quant:
        return state
    out = {}
    for key, value in state.items():
        if ".weight." in key and key.split(".weight.")[0] + ".weight" in quant:
            continue
        out[key] = plain_weight(quant[key]).detach().cpu() if key in quant else value
    return out


@contextlib.contextmanager
def unquantized_view(model: torch.nn.Module):
    """For the duration, transformers sees `model` as a plain model (no quantizer, no quantization_config),
    so save_pretrained writes the state dict it is given (dequantized) and a config that loads plainly."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        yield model
        return
    qconfig = model.config.quantization_config
    model.hf_quantizer = None
    del model.config.quantization_config
    try:
        yield model
    finally:
        model.hf_quantizer, model.config.quantization_config = quantizer, qconfig


def add_adapter(model: torch.nn.Module, lora_cfg) -> torch.nn.Module:
    """Inject a LoRA adapter (rank, alpha, dropout, target modules) into `model` in place and return it.
    Base weights are frozen; a reward/value model's scalar head (`score`) stays trainable."""
    import peft

    head = ["score"] if getattr(model, "score", None) is not None else None  # trained whole, not adapted
    config = peft.LoraConfig(r=int(lora_cfg.rank), lora_alpha=float(lora_cfg.alpha), lora_dropout=float(lora_cfg.dropout),
                             target_modules=_targets(lora_cfg.target_modules), exclude_modules=head, bias="none")
    wrapped = peft.get_peft_model(model, config, adapter_name=ADAPTER)
    model = wrapped.get_base_model()
    if head:
        model.score.requires_grad_(True)
    model.rlft_lora_config = config
    return model


def _targets(names) -> str | list[str]:
    names = [str(n) for n in names]
    return names[0] if names == ["all-linear"] else names


def has_adapter(model: torch.nn.Module) -> bool:
    return hasattr(model, "rlft_lora_config")


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """{module name: peft LoRA layer} of the model."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


@contextlib.contextmanager
def adapter_disabled(model: torch.nn.Module):
    """The base model (every adapter off) for the duration."""
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def merged_weights(model: torch.nn.Module, named_parameters, gathered, copy_whole: bool = False):
    """(plain name, weight) for every parameter of the adapted model, as a weight sync wants them: each adapted
    layer's base weight merged with its adapter by peft's own delta (the layer's get_delta_weight); A and B
    themselves are not handed out. `gathered(params)` makes parameters whole for the duration (ZeRO-3), and
    then `copy_whole` hands out a copy of an unadapted one (a merged weight is a new tensor already)."""
    layers = lora_layers(model)
    for key, p in named_parameters:
        if ".lora_" in key:
            continue
        module, base, leaf = key.partition(BASE)
        name = f"{module}.{leaf}" if base else key
        params = [p]
        adapted = base and module in layers and leaf == "weight"
        if adapted:
            layer = layers[module]
            params += [*layer.lora_A[ADAPTER].parameters(), *layer.lora_B[ADAPTER].parameters()]
        with gathered(params), torch.no_grad():
            weight = plain_weight(p).detach()
            if adapted:
                weight = weight + layer.get_delta_weight(ADAPTER).to(weight.dtype)
            elif copy_whole:
                weight = weight.clone()
            yield name, weight


def peft_copy(model: torch.nn.Module, state: dict[str, torch.Tensor]):
    """A CPU PeftModel of the adapted model holding `state` (a full, gathered state dict), for peft's own API:
    its save_pretrained writes the adapter folder (its config naming the base), its merge_and_unload gives
    the plain model. The base weights that merging changes in place are copies, never the trainer's
    tensors. QLoRA: `state` holds the dequantized base (dequantized_state_dict), so the copy is plain."""
    import peft

    config = copy.deepcopy(model.rlft_lora_config)
    if getattr(model, "score", None) is None:
        config.task_type = "CAUSAL_LM"  # an adapter beside a reward or value head does not carry the head
    with unquantized_view(model), torch.device("meta"):
        shell = type(model)._from_config(model.config)
    wrapped = peft.get_peft_model(shell, config, adapter_name=ADAPTER)
    wrapped.peft_config[ADAPTER].base_model_name_or_path = base_model_name(model)  # get_peft_model sets its own
    owned = {k: v.clone() if k.endswith(BASE + "weight") else v for k, v in state.items()}
    wrapped.get_base_model().load_state_dict(owned, strict=True, assign=True)
    return wrapped


def base_model_name(model: torch.nn.Module) -> str | None:
    """Where the adapted model's base came from, for the adapter's config: an absolute folder, a hub id, or
    None for a model built fresh (the built-in one), whose adapter is read beside its merged model."""
    name = str(getattr(model.config, "_name_or_path", "") or "")
    if not name:
        return None
    local = Path(name).expanduser()
    return str(local.resolve()) if local.exists() else name


def merged_folder(adapter_dir: Path, resolve, trust_remote_code: bool = False) -> str:
    """An adapter folder given as model.path, as a plain model folder: its base (the adapter config's
    base_model_name_or_path, itself resolved by `resolve` as a model.path) with the adapter merged by peft
    (PeftModel.from_pretrained, merge_and_unload), written once with the base's tokenizer under the model
    cache (rlft/files/cache.py), so every stage, rank and rollout engine reads an ordinary folder."""
    import json

    from rlft.errors import MissingInputError
    from rlft.files import cache

    config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    beside = adapter_dir.with_name(adapter_dir.name.removesuffix("-adapter"))
    use_merged = f"use the merged model beside it ({beside})" if (beside / "config.json").is_file() else \
        "use a merged model"
    if config.get("task_type") != "CAUSAL_LM":
        raise MissingInputError(f"{adapter_dir} is an adapter for task_type {config.get('task_type')}; a model.path "
                                f"adapter must be a causal LM's (task_type CAUSAL_LM), since one beside a reward or "
                                f"value head does not carry the head: {use_merged}")
    base = config.get("base_model_name_or_path")
    if not base:
        raise MissingInputError(f"{adapter_dir}/adapter_config.json names no base model (base_model_name_or_path: the "
                                f"adapter was trained on a model built fresh): {use_merged}")
    base_dir = resolve(base)
    weights = next((adapter_dir / f for f in ("adapter_model.safetensors", "adapter_model.bin")
                    if (adapter_dir / f).is_file()), None)
    if weights is None:
        raise MissingInputError(f"{adapter_dir} has no adapter_model.safetensors; copy or export the adapter again")
    out = cache.model_folder(f"{adapter_dir.name}-{cache.file_hash(weights)}-{cache.text_hash(base_dir)}")
    if (out / "config.json").is_file():
        return str(out)
    import peft
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[rlft] merging the adapter {adapter_dir} onto {base_dir} into {out} (once)", flush=True)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, trust_remote_code=trust_remote_code)
    merged = peft.PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    tmp = cache.temporary_for(out)
    merged.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(base_dir, trust_remote_code=trust_remote_code).save_pretrained(tmp)
    cache.publish(tmp, out)
    return str(out)

